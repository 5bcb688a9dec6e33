// Documents: the tenant's documents with live states, a state filter,
// search by name or id, and pages; a form that submits text or uploads a
// file.
import { api, EventStream, explain, upload } from './api.js';
import { bytes, chip, clear, DOC_STATES, h, num, throttle, time } from './util.js';

const PAGE_SIZES = [10, 20, 50, 100];
// Search reads the newest documents in pages of SEARCH_PAGE_SIZE (the
// API's largest), at most SEARCH_PAGES of them, and shows the first
// SEARCH_SHOWN matches; an exact document id is always found.
const SEARCH_PAGE_SIZE = 1000;
const SEARCH_PAGES = 10;
const SEARCH_SHOWN = 100;

export function documentsView({ setLive }) {
  const state = {
    filter: sessionStorage.getItem('pipestream.console.filter') || '',
    size: Number(sessionStorage.getItem('pipestream.console.pagesize')) || 20,
    tokens: [''], page: 0, rows: new Map(),
    query: sessionStorage.getItem('pipestream.console.search') || '',
  };
  const tbody = h('tbody');
  const status = h('p.muted.list-status', { dataset: { testid: 'list-status' } });
  const prev = h('button', { id: 'page-newer', type: 'button', disabled: true, on: { click: () => go(state.page - 1) } }, '← Newer');
  const next = h('button', { id: 'page-older', type: 'button', disabled: true, on: { click: () => go(state.page + 1) } }, 'Older →');
  const pageNo = h('span.muted', { dataset: { testid: 'page' } });
  const pager = h('div.pager', prev, pageNo, next);
  const filter = h('select', { id: 'state-filter', on: { change: () => { state.filter = filter.value; sessionStorage.setItem('pipestream.console.filter', state.filter); state.tokens = ['']; go(0); } } },
    h('option', { value: '' }, 'all states'),
    DOC_STATES.map((s) => h('option', { value: s, selected: s === state.filter }, s.replace(/_/g, ' ').toLowerCase())));

  const search = h('input', { id: 'doc-search', type: 'search', placeholder: 'name or id', value: state.query, autocomplete: 'off',
    on: { input: () => { state.query = search.value.trim(); sessionStorage.setItem('pipestream.console.search', state.query); searchSoon(); } } });

  const size = h('select', { id: 'page-size', on: { change: () => { state.size = Number(size.value); sessionStorage.setItem('pipestream.console.pagesize', size.value); state.tokens = ['']; go(0); } } },
    PAGE_SIZES.map((n) => h('option', { value: String(n), selected: n === state.size }, String(n))));

  let loading = null;
  let target = 0; // the page shown, or being loaded: a live reload must not undo a click on Older/Newer
  async function go(page) {
    if (state.query) return find(state.query);
    if (loading) loading.abort();
    target = page;
    loading = new AbortController();
    const q = new URLSearchParams({ pageSize: state.size });
    if (state.tokens[page]) q.set('pageToken', state.tokens[page]);
    if (state.filter) q.set('state', state.filter);
    try {
      const resp = await api('/v1/documents?' + q, { signal: loading.signal });
      state.page = page;
      state.tokens[page + 1] = resp.nextPageToken || '';
      render(resp.documents || []);
    } catch (e) {
      if (e.name === 'AbortError') return;
      clear(tbody);
      status.className = 'error list-status';
      status.textContent = explain(e);
    }
  }
  const reload = throttle(() => go(target), 500);
  const searchSoon = throttle(() => { state.tokens = ['']; go(0); }, 250);
  // Live updates re-run a search at most every 2 s: it reads up to
  // SEARCH_PAGES pages.
  const research = throttle(() => { if (state.query) find(state.query); }, 2000);

  // find lists the documents whose display name or id contains q (case
  // insensitive), in the state filter, newest first: the document with id
  // q itself, then matches among the newest SEARCH_PAGES pages.
  async function find(q) {
    if (loading) loading.abort();
    loading = new AbortController();
    const signal = loading.signal;
    const needle = q.toLowerCase();
    const matches = new Map();
    let scanned = 0;
    let more = false;
    try {
      try {
        const d = await api('/v1/documents/' + encodeURIComponent(q), { signal });
        if (!state.filter || d.state === state.filter) matches.set(d.id, d);
      } catch (e) {
        if (e.name === 'AbortError') throw e;
        if (e.status !== 404 && e.status !== 400) throw e; // not an id
      }
      let token = '';
      for (let page = 0; page < SEARCH_PAGES && matches.size < SEARCH_SHOWN; page++) {
        const p = new URLSearchParams({ pageSize: SEARCH_PAGE_SIZE });
        if (token) p.set('pageToken', token);
        if (state.filter) p.set('state', state.filter);
        const resp = await api('/v1/documents?' + p, { signal });
        for (const d of resp.documents || []) {
          scanned++;
          if ((d.displayName || '').toLowerCase().includes(needle) || d.id.toLowerCase().includes(needle)) matches.set(d.id, d);
        }
        token = resp.nextPageToken || '';
        if (!token) break;
      }
      more = !!token;
    } catch (e) {
      if (e.name === 'AbortError') return;
      clear(tbody);
      status.className = 'error list-status';
      status.textContent = explain(e);
      return;
    }
    const docs = [...matches.values()].slice(0, SEARCH_SHOWN);
    render(docs);
    pager.hidden = true; // matches are one list
    status.dataset.matches = String(docs.length);
    status.textContent = (docs.length ? num(docs.length) + (docs.length === 1 ? ' document matches' : ' documents match') : 'No document matches')
      + ' "' + q + '"' + (state.filter ? ' in state ' + state.filter.toLowerCase().replace(/_/g, ' ') : '')
      + (more ? ' among the newest ' + num(scanned) + ' (search reads at most ' + num(SEARCH_PAGES * SEARCH_PAGE_SIZE) + '; an exact id is always found)' : '')
      + (matches.size >= SEARCH_SHOWN ? '; the first ' + num(SEARCH_SHOWN) + ' are shown, type more to narrow it' : '')
      + '.';
  }

  function render(docs) {
    state.rows.clear();
    delete status.dataset.matches;
    clear(tbody, docs.map(row));
    status.className = 'muted list-status';
    status.textContent = docs.length ? '' : (state.filter ? 'No documents in this state.' : 'No documents yet: submit one below.');
    pager.hidden = false;
    prev.disabled = state.page === 0;
    next.disabled = !state.tokens[state.page + 1];
    pageNo.textContent = 'page ' + (state.page + 1);
  }

  function row(d) {
    const c = d.entityCounts || {};
    const stateCell = h('td', chip(d.state));
    const tr = h('tr', { dataset: { id: d.id, state: d.state } },
      h('td', h('a', { href: '#/documents/' + encodeURIComponent(d.id) }, d.displayName || d.id), d.displayName ? h('div.muted.mono', d.id) : null),
      stateCell,
      h('td.num', bytes(d.sizeBytes)),
      h('td.num', num(c.complete) + ' / ' + num(c.total)),
      h('td', (d.split && d.split.processor) || ''),
      h('td.muted', time(d.createTime)));
    state.rows.set(d.id, { tr, stateCell });
    return tr;
  }

  // Live states: #document events change a row in place; a document that
  // is not on the page (new, or now matching the filter) reloads the page.
  const stream = new EventStream({
    kinds: ['#document'],
    onEvent: (kind, ev) => {
      if (state.query) { research(); return; }
      const r = state.rows.get(ev.documentId);
      if (r && ev.state && (!state.filter || state.filter === ev.state)) {
        r.tr.dataset.state = ev.state;
        clear(r.stateCell, chip(ev.state));
        reload(); // counts and sizes
      } else if (state.page === 0 || r) {
        reload();
      }
    },
    onState: (s, detail) => {
      setLive(s, detail);
      if (s === 'live') reload(); // catch up with what happened while offline
    },
  });

  const el = h('section.documents',
    h('div.panel',
      h('div.panel-head', h('h2', 'Documents'), h('div.inline', h('label.inline', 'Search ', search), h('label.inline', 'State ', filter), h('label.inline', 'Per page ', size))),
      h('table.list', { dataset: { testid: 'documents' } },
        h('thead', h('tr', ['Document', 'State', 'Size', 'Entities done', 'Processor', 'Created'].map((t) => h('th', t)))),
        tbody),
      status,
      pager),
    submitForm());
  go(0);
  return { el, title: 'Documents', dispose: () => { stream.close(); reload.cancel(); searchSoon.cancel(); research.cancel(); if (loading) loading.abort(); } };
}

function field(label, input, hint) {
  return h('label.field', h('span', label), input, hint ? h('small.muted', hint) : null);
}

function select(id, options, value) {
  return h('select', { id }, options.map(([v, t]) => h('option', { value: v, selected: v === value }, t)));
}

/** submitForm: text or file, split, processor, completion policy, metadata. */
function submitForm() {
  const text = h('textarea', { id: 'submit-text', rows: 5, placeholder: 'Hello world. This is PipeStream.' });
  const file = h('input', { id: 'submit-file', type: 'file' });
  const source = select('submit-source', [['text', 'Text'], ['file', 'File']], 'text');
  const textBox = field('Text', text);
  const fileBox = field('File', file);
  fileBox.hidden = true;
  source.addEventListener('change', () => { textBox.hidden = source.value !== 'text'; fileBox.hidden = source.value !== 'file'; });
  const name = h('input', { id: 'submit-name', placeholder: 'report.txt' });
  const ctype = h('input', { id: 'submit-type', placeholder: 'text/plain (file: its own type)' });
  const strategy = select('split-strategy', [['', 'gateway chooses'], ['SPLIT_NONE', 'none (whole)'], ['SPLIT_FIXED_BYTES', 'fixed bytes'], ['SPLIT_LINES', 'lines'], ['SPLIT_PARAGRAPHS', 'paragraphs']], '');
  const chunk = h('input', { id: 'split-chunk', type: 'number', min: 1, placeholder: '1048576' });
  const depth = h('input', { id: 'split-depth', type: 'number', min: 0, max: 7, placeholder: '0' });
  const processor = select('split-processor', [['passthrough', 'passthrough'], ['textstats', 'textstats'], ['sentences', 'sentences'], ['fault', 'fault']], 'passthrough');
  const mode = select('policy-mode', [['', 'default (strict)'], ['STRICT', 'strict'], ['LENIENT', 'lenient'], ['BEST_EFFORT', 'best effort'], ['QUORUM', 'quorum']], '');
  const ratio = h('input', { id: 'policy-ratio', type: 'number', min: 0, max: 1, step: 0.05, placeholder: '0.5' });
  const retries = h('input', { id: 'policy-retries', type: 'number', min: 0, placeholder: '0' });
  const timeout = h('input', { id: 'policy-timeout', type: 'number', min: 0, placeholder: 'ms' });
  const actions = [['', 'default'], ['FAIL', 'fail'], ['SKIP', 'skip'], ['RETRY', 'retry'], ['DEFER', 'defer']];
  const onFailure = select('policy-onfailure', actions, '');
  const onTimeout = select('policy-ontimeout', actions, '');
  const metadata = h('textarea', { id: 'submit-metadata', rows: 3, placeholder: 'pipestream.fault=defer\nsource=crm' });
  const bar = h('div.progress-fill');
  const progressText = h('span.muted', { dataset: { testid: 'upload-progress' } });
  const progress = h('div.progress', { hidden: true }, h('div.progress-bar', bar), progressText);
  const outcome = h('p.outcome', { dataset: { testid: 'submit-outcome' } });
  const button = h('button.primary', { id: 'submit-button', type: 'submit' }, 'Submit');

  function query() {
    const q = new URLSearchParams();
    const set = (k, v) => { if (v !== '' && v !== undefined && v !== null) q.set(k, v); };
    set('displayName', name.value.trim() || (source.value === 'file' && file.files[0] ? file.files[0].name : ''));
    set('contentType', ctype.value.trim());
    set('split.strategy', strategy.value);
    set('split.chunkBytes', chunk.value);
    set('split.maxDepth', depth.value);
    set('split.processor', processor.value);
    set('completionPolicy.mode', mode.value);
    set('completionPolicy.minSuccessRatio', ratio.value);
    set('completionPolicy.maxRetries', retries.value);
    set('completionPolicy.timeoutMs', timeout.value);
    set('completionPolicy.onFailure', onFailure.value);
    set('completionPolicy.onTimeout', onTimeout.value);
    for (const line of metadata.value.split('\n')) {
      const i = line.indexOf('=');
      if (line.trim() === '') continue;
      if (i <= 0) throw new Error('metadata lines are key=value: ' + JSON.stringify(line));
      q.set('metadata.' + line.slice(0, i).trim(), line.slice(i + 1).trim());
    }
    return q;
  }

  async function submit(e) {
    e.preventDefault();
    outcome.className = 'outcome';
    outcome.textContent = '';
    let blob;
    if (source.value === 'file') {
      blob = file.files[0];
      if (!blob) { outcome.className = 'outcome error'; outcome.textContent = 'Choose a file first.'; return; }
    } else {
      blob = new Blob([text.value], { type: ctype.value.trim() || 'text/plain' });
    }
    let q;
    try { q = query(); } catch (err) { outcome.className = 'outcome error'; outcome.textContent = err.message; return; }
    button.disabled = true;
    progress.hidden = false;
    const show = (sent, total) => {
      const pct = total > 0 ? (100 * sent) / total : 100;
      bar.style.width = pct.toFixed(1) + '%';
      progressText.textContent = bytes(sent) + ' of ' + bytes(total) + ' (' + pct.toFixed(0) + '%)';
      progress.dataset.percent = pct.toFixed(0);
    };
    show(0, blob.size);
    try {
      const doc = await upload(blob, q, show);
      show(blob.size, blob.size);
      outcome.className = 'outcome ok';
      outcome.textContent = 'Accepted as ' + doc.id + '.';
      location.hash = '#/documents/' + encodeURIComponent(doc.id);
    } catch (err) {
      outcome.className = 'outcome error';
      outcome.textContent = explain(err);
    } finally {
      button.disabled = false;
    }
  }

  return h('form.panel.submit', { id: 'submit-form', on: { submit } },
    h('div.panel-head', h('h2', 'Submit a document')),
    h('div.grid',
      field('Source', source), textBox, fileBox,
      field('Display name', name), field('Content type', ctype)),
    h('fieldset', h('legend', 'Split'),
      h('div.grid', field('Strategy', strategy), field('Chunk bytes', chunk, 'at most 16 MiB'), field('Max depth', depth, 'Layer 1 nesting, 0-7'), field('Processor', processor))),
    h('fieldset', h('legend', 'Completion policy'),
      h('div.grid', field('Mode', mode), field('Min success ratio', ratio, 'quorum'), field('Max retries', retries), field('Timeout', timeout, 'ms per attempt'), field('On failure', onFailure), field('On timeout', onTimeout))),
    field('Metadata', metadata, 'key=value per line; the fault processor reads pipestream.fault (fail, fail-once, yield, defer, timeout, timeout-once)'),
    h('div.actions', button, progress),
    outcome);
}
