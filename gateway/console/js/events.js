// The event log: the retained window and retention gauges, and a live tail.
import { api, EventStream, explain } from './api.js';
import { bytes, clear, gauge, h, num, shortTime, throttle } from './util.js';
import { describe } from './document.js';
import { fetchMetrics, sum } from './metrics.js';

const TAIL_ROWS = 500;

export function eventsView({ setLive }) {
  const gauges = h('div.gauges', { dataset: { testid: 'gauges' } });
  const windowFacts = h('dl.facts', { dataset: { testid: 'window' } });
  const tail = h('ol.timeline.tail', { dataset: { testid: 'tail' } });
  const note = h('p.muted');
  const kind = h('select', { id: 'tail-kind' }, ['', '#document', '#status', '#claim', '#info'].map((k) => h('option', { value: k }, k || 'all kinds')));
  const pause = h('input', { type: 'checkbox', id: 'tail-pause' });
  const rows = [];
  let stream = null;
  let seen = 0;

  async function refreshWindow() {
    try {
      const [w, m] = await Promise.all([api('/v1/events:window'), fetchMetrics().catch(() => ({}))]);
      const retained = Number(w.retainedBytes || 0);
      const snap = Number(w.snapshotBytes || 0);
      clear(windowFacts,
        fact('oldest seq', num(w.oldestSeq)), fact('latest seq', num(w.latestSeq)),
        fact('retained events', num(w.retainedEvents)), fact('active clients', num(w.activeClients)));
      clear(gauges,
        gauge('retained bytes vs snapshot size', retained, snap, bytes(retained) + ' of ' + bytes(snap)),
        h('dl.facts',
          fact('tracked clients', num(sum(m, 'pipestream_eventlog_tracked_clients'))),
          fact('pruned events', num(sum(m, 'pipestream_eventlog_pruned_events_total'))),
          fact('pruned bytes', bytes(sum(m, 'pipestream_eventlog_pruned_bytes_total'))),
          fact('prunes by rule', (m.pipestream_eventlog_pruned_events_total || []).map((s) => (s.labels.reason || '?') + ' ' + num(s.value)).join(', ') || '—'),
          fact('saved vs size-only', bytes(sum(m, 'pipestream_eventlog_bytes_saved'))),
          fact('open subscriptions', num(sum(m, 'pipestream_eventlog_subscribers'))),
          fact('outdated cursors', num(sum(m, 'pipestream_eventlog_outdated_cursor_total'))),
          fact('too-slow consumers', num(sum(m, 'pipestream_eventlog_consumer_too_slow_total')))));
      gauges.dataset.retained = String(retained);
      gauges.dataset.snapshot = String(snap);
      return w;
    } catch (e) {
      clear(gauges, h('p.error', explain(e)));
      return null;
    }
  }
  // The window changes with the events themselves: refresh as they flow.
  const refreshSoon = throttle(refreshWindow, 2000);

  function follow(cursor) {
    if (stream) stream.close();
    rows.length = 0;
    seen = 0;
    render();
    stream = new EventStream({
      cursor,
      kinds: kind.value ? [kind.value] : [],
      onEvent: (k, ev) => {
        seen++;
        rows.push([k, ev]);
        if (rows.length > TAIL_ROWS) rows.splice(0, rows.length - TAIL_ROWS);
        if (!pause.checked) renderSoon();
        refreshSoon();
      },
      onState: (s, d) => setLive(s, d),
    });
  }

  const renderSoon = throttle(render, 200);
  function render() {
    clear(tail, rows.slice().reverse().map(([k, ev]) => h('li', { dataset: { kind: k, doc: ev.documentId || '' } },
      h('span.mono.muted', shortTime(ev.time)), h('span.mono.muted', ev.seq ? '#' + ev.seq : ''), h('span.kind', k),
      ev.documentId ? h('a.mono', { href: '#/documents/' + encodeURIComponent(ev.documentId) }, ev.documentId) : null,
      h('span', describe(k, ev)))));
    note.textContent = num(seen) + ' events received' + (seen > TAIL_ROWS ? ', latest ' + TAIL_ROWS + ' shown' : '') + (pause.checked ? ' (paused)' : '');
  }

  const start = async (whole) => {
    const w = await refreshWindow();
    const latest = w ? Number(w.latestSeq || 0) : 0;
    // The last 100 events of the window, then live; or the whole window.
    follow(whole ? 0 : latest > 0 ? Math.max(1, latest - 99) : null);
  };
  kind.addEventListener('change', () => start(false));
  pause.addEventListener('change', render);

  const el = h('section.events',
    h('div.panel', h('div.panel-head', h('h2', 'Retained window'), h('button', { type: 'button', on: { click: refreshWindow } }, 'Refresh')),
      windowFacts, gauges),
    h('div.panel', h('div.panel-head', h('h2', 'Live tail'),
      h('div.inline', h('label.inline', 'Kind ', kind), h('label.inline', pause, ' pause'),
        h('button', { type: 'button', on: { click: () => start(true) } }, 'Replay whole window'))),
    note, tail));
  start(false);
  return { el, title: 'Event log', dispose: () => { if (stream) stream.close(); refreshSoon.cancel(); renderSoon.cancel(); } };
}

function fact(k, v) {
  return [h('dt', k), h('dd', v)];
}
