// Peers: the gateway's health and, when /healthz reports them, each peer's
// connection state, framing, window use and last error.
import { clear, gauge, h, num } from './util.js';
import { fetchMetrics, sum } from './metrics.js';

const REFRESH_MS = 3000;
// UNBOUNDED_WINDOW: a window this large (draft-02's largest, 2^31, less the
// two IDs a peer never hands out) limits nothing in practice: it is shown
// as "unbounded", not as a gauge that never moves.
const UNBOUNDED_WINDOW = 2 ** 31 - 2;

export function peersView() {
  const health = h('div.health', { dataset: { testid: 'health' } });
  const table = h('div.peers', { dataset: { testid: 'peers' } });
  const counters = h('dl.facts');
  let timer = 0;
  let stopped = false;

  async function refresh() {
    clearTimeout(timer);
    let j = null;
    let code = 0;
    try {
      const resp = await fetch('/healthz', { cache: 'no-store' });
      code = resp.status;
      j = await resp.json();
    } catch (e) {
      j = { status: 'UNREACHABLE', reason: String(e.message || e) };
    }
    if (stopped) return;
    const st = j.status || 'UNKNOWN';
    clear(health, h('div.title', h('h2', 'Gateway'), h('span.chip.st-' + st, { dataset: { state: st } }, st.toLowerCase().replace(/_/g, ' '))),
      j.reason ? h('p.error', j.reason) : h('p.muted', 'HTTP ' + code + ' from /healthz'));
    renderPeers(Array.isArray(j.peers) ? j.peers : null);
    try {
      const m = await fetchMetrics();
      clear(counters,
        fact('session connects', num(sum(m, 'pipestream_bridge_session_connects_total'))),
        fact('dispatch retries', num(sum(m, 'pipestream_bridge_dispatch_retries_total'))),
        fact('documents active', num(sum(m, 'pipestream_bridge_documents_active'))),
        fact('digest mismatches', num(sum(m, 'pipestream_bridge_scope_digest_mismatch_total'))));
    } catch {
      clear(counters);
    }
    if (!stopped) timer = setTimeout(refresh, REFRESH_MS);
  }

  function renderPeers(peers) {
    if (!peers) {
      clear(table, h('p.muted', { dataset: { testid: 'no-peers' } },
        'This gateway does not list its peers in /healthz yet; its status above covers its peer session.'));
      return;
    }
    if (!peers.length) {
      clear(table, h('p.muted', 'No peers configured.'));
      return;
    }
    clear(table, h('table.list',
      h('thead', h('tr', ['Peer', 'State', 'Framing', 'Profile', 'Window use', 'Last error'].map((t) => h('th', t)))),
      h('tbody', peers.map((p) => {
        const inFlight = Number(p.inFlight || 0);
        const win = Number(p.window || 0);
        return h('tr', { dataset: { addr: p.addr || '', state: p.state || '' } },
          h('td.mono', p.addr || '?'),
          h('td', h('span.chip.st-peer-' + (p.state || 'unknown'), p.state || 'unknown')),
          h('td', framingText(p)),
          h('td', p.profile === undefined ? '—' : p.profile ? 'yes' : 'no'),
          h('td.wide', { dataset: { testid: 'window-use' } }, windowUse(inFlight, win)),
          h('td', lastErrorCell(p)));
      }))));
  }

  const el = h('section.peers-view',
    h('div.panel', health, counters),
    h('div.panel', h('div.panel-head', h('h2', 'Peers'), h('button', { type: 'button', on: { click: refresh } }, 'Refresh')), table));
  refresh();
  return { el, title: 'Peers', dispose: () => { stopped = true; clearTimeout(timer); } };
}

// windowUse shows in-flight entities against the peer's window: a gauge,
// or the count alone when the window is unknown (0) or unbounded.
function windowUse(inFlight, win) {
  if (win >= UNBOUNDED_WINDOW) return h('span', num(inFlight) + ' in flight · window unbounded');
  if (!win) return num(inFlight) + ' in flight';
  return gauge('', inFlight, win, num(inFlight) + ' / ' + num(win) + ' in flight');
}

// framingText: the framing in use, and the one that last carried work
// when it differs (auto framing learns it per peer).
function framingText(p) {
  const f = p.framing || '—';
  return p.framingWorked && p.framingWorked !== p.framing ? f + ' (worked: ' + p.framingWorked + ')' : f;
}

// lastErrorCell: the peer's last failure, since when, and how many of its
// sessions ended right after the handshake (each counted as a failed dial).
function lastErrorCell(p) {
  const parts = [];
  if (p.lastError) {
    parts.push(h('span.error', { dataset: { testid: 'last-error' } }, p.lastError));
    if (p.since) parts.push(h('span.muted', ' since ' + new Date(p.since).toLocaleString()));
  }
  if (p.shortSessions) parts.push(h('span.muted', { dataset: { testid: 'short-sessions' } }, ' · ' + num(p.shortSessions) + ' sessions ended right after the handshake'));
  return parts.length ? parts : h('span.muted', '—');
}

function fact(k, v) {
  return [h('dt', k), h('dd', v)];
}
