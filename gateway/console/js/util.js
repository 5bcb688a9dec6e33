// Small DOM and formatting helpers.

/** h builds an element: h('div.a.b', {attrs, on: {click}}, ...children). */
export function h(tag, props, ...children) {
  const [name, ...classes] = tag.split('.');
  const el = document.createElement(name || 'div');
  if (classes.length) el.className = classes.join(' ');
  if (props && (typeof props !== 'object' || props instanceof Node || Array.isArray(props))) {
    children.unshift(props);
    props = null;
  }
  for (const [k, v] of Object.entries(props || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'on') for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k === 'text') el.textContent = v;
    else if (k in el && typeof v !== 'string') el[k] = v;
    else el.setAttribute(k, v === true ? '' : v);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

export function clear(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export function bytes(n) {
  n = Number(n || 0);
  if (n < 1024) return n + ' B';
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let i = -1;
  do {
    n /= 1024;
    i++;
  } while (n >= 1024 && i < units.length - 1);
  return (n >= 100 ? n.toFixed(0) : n.toFixed(1)) + ' ' + units[i];
}

export function num(n) {
  return Number(n || 0).toLocaleString('en-US');
}

export function time(ts) {
  if (!ts) return '';
  const d = new Date(ts);
  return isNaN(d) ? String(ts) : d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
}

export function shortTime(ts) {
  const d = new Date(ts);
  return isNaN(d) ? '' : d.toISOString().slice(11, 23);
}

/** entityStatus strips the enum prefix: ENTITY_STATUS_COMPLETE -> COMPLETE. */
export function entityStatus(s) {
  return String(s || 'UNSPECIFIED').replace(/^ENTITY_STATUS_/, '');
}

export const DOC_STATES = ['PENDING', 'RUNNING', 'SUCCEEDED', 'PARTIALLY_SUCCEEDED', 'FAILED', 'CANCELLED'];
export const TERMINAL = new Set(['SUCCEEDED', 'PARTIALLY_SUCCEEDED', 'FAILED', 'CANCELLED']);
export const ENTITY_STATUSES = ['PENDING', 'PROCESSING', 'CHECKPOINT', 'DEHYDRATING', 'REHYDRATING', 'YIELDED',
  'DEFERRED', 'RETRYING', 'COMPLETE', 'FAILED', 'SKIPPED', 'ABANDONED'];

export function chip(state, extra = '') {
  const s = state || 'UNSPECIFIED';
  return h('span.chip.st-' + s + (extra ? '.' + extra : ''), { dataset: { state: s } }, s.replace(/_/g, ' ').toLowerCase());
}

/** throttle runs fn at most once per ms (trailing call kept). */
export function throttle(fn, ms) {
  let last = 0;
  let timer = 0;
  const run = () => {
    timer = 0;
    last = Date.now();
    fn();
  };
  const t = () => {
    if (timer) return;
    const wait = Math.max(0, last + ms - Date.now());
    timer = setTimeout(run, wait);
  };
  t.cancel = () => clearTimeout(timer);
  return t;
}

/** gauge is a labelled bar: value of max. */
export function gauge(label, value, max, text) {
  const pct = max > 0 ? Math.min(100, (100 * value) / max) : 0;
  const fill = h('div.gauge-fill');
  fill.style.width = pct.toFixed(1) + '%';
  if (pct > 90) fill.classList.add('hot');
  return h('div.gauge', { dataset: { label } },
    h('div.gauge-label', h('span', label), h('span.muted', text ?? (num(value) + ' / ' + num(max)))),
    h('div.gauge-bar', fill));
}
