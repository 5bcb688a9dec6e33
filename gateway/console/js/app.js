// The console's shell: hash router, token field, live indicator.
import { getToken, setToken } from './api.js';
import { clear, h } from './util.js';
import { documentsView } from './documents.js';
import { documentView } from './document.js';
import { eventsView } from './events.js';
import { peersView } from './peers.js';

const main = document.getElementById('view');
const live = document.getElementById('live');
let current = null;

/** setLive shows the state of the current view's event stream. */
export function setLive(state, detail) {
  live.dataset.state = state;
  live.title = 'event stream: ' + state + (detail ? ' — ' + detail : '');
}

function route() {
  const hash = location.hash.replace(/^#\/?/, '') || 'documents';
  const [section, ...rest] = hash.split('/');
  const arg = decodeURIComponent(rest.join('/'));
  if (current && current.dispose) current.dispose();
  current = null;
  setLive('idle');
  for (const a of document.querySelectorAll('[data-nav]')) a.classList.toggle('active', a.dataset.nav === section);
  const ctx = { setLive };
  switch (section) {
    case 'documents':
      current = arg ? documentView(arg, ctx) : documentsView(ctx);
      break;
    case 'events':
      current = eventsView(ctx);
      break;
    case 'peers':
      current = peersView(ctx);
      break;
    default:
      current = { el: h('p.error', 'Unknown page: ' + hash) };
  }
  clear(main, current.el);
  document.title = (current.title || section) + ' · PipeStream console';
}

const tokenInput = document.getElementById('token');
tokenInput.value = getToken();
document.getElementById('token-form').addEventListener('submit', (e) => {
  e.preventDefault();
  setToken(tokenInput.value.trim());
});
document.getElementById('token-clear').addEventListener('click', () => {
  tokenInput.value = '';
  setToken('');
});
window.addEventListener('pipestream:token', route);
window.addEventListener('hashchange', route);
route();
