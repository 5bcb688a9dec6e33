// One document: its state, the entity tree filling in live, the timeline
// of its events, claim checks with redemption, the result and the error.
import { api, EventStream, explain, fetchResult, getToken } from './api.js';
import { bytes, chip, clear, entityStatus, h, num, shortTime, TERMINAL, throttle, time } from './util.js';
import { statusBar, TreeModel, TreeView } from './tree.js';

const TIMELINE_ROWS = 300;
const MAX_GROUPS = 12; // scope/depth rows in the summary
const PREVIEW_BYTES = 64 << 10;

export function documentView(id, { setLive }) {
  const model = new TreeModel();
  const tree = new TreeView(model);
  const head = h('div.doc-head');
  const summary = h('div.summary', { dataset: { testid: 'summary' } });
  const digests = h('div.digests');
  const claims = h('div.claims', { dataset: { testid: 'claims' } });
  const result = h('div.result', { dataset: { testid: 'result' } });
  const failure = h('div.failure', { dataset: { testid: 'failure' } });
  const timelineList = h('ol.timeline', { dataset: { testid: 'timeline' } });
  const timelineNote = h('p.muted');
  const showStatus = h('input', { type: 'checkbox', checked: true, id: 'timeline-status' });
  const events = [];
  const outcomes = new Map(); // claim id -> {cls, result, text}: kept across re-renders
  let doc = null;
  let resultShownFor = '';
  let disposed = false;

  const el = h('section.document', { dataset: { testid: 'document', id } },
    h('p', h('a', { href: '#/documents' }, '← Documents')),
    head,
    failure,
    h('div.panel', h('div.panel-head', h('h2', 'Entities'), h('span.muted', 'live from #status events')), summary, tree.viewport, digests),
    h('div.panel', h('div.panel-head', h('h2', 'Claim checks')), claims),
    h('div.panel', h('div.panel-head', h('h2', 'Result')), result),
    h('div.panel', h('div.panel-head', h('h2', 'Timeline'), h('label.inline', showStatus, ' entity statuses')), timelineList, timelineNote));
  showStatus.addEventListener('change', () => renderTimeline());

  let inFlight = false;
  let again = false;
  async function refetch() {
    if (inFlight) { again = true; return; }
    inFlight = true;
    try {
      const d = await api('/v1/documents/' + encodeURIComponent(id) + '?includeEntities=true');
      if (disposed) return;
      doc = d;
      model.load(d.entities, d.digests);
      renderDoc();
    } catch (e) {
      if (disposed) return;
      if (e.status === 404 || e.status === 401) stream.close(); // nothing to follow
      clear(head, h('h2', id), h('p.error', { dataset: { testid: 'doc-error' } }, explain(e)));
    } finally {
      inFlight = false;
      if (again && !disposed) { again = false; schedule(); }
    }
  }
  // Structural changes (new entities, digests, claims, the result) come
  // from a refetch that events trigger; large trees refetch less often.
  const fast = throttle(refetch, 300);
  const slow = throttle(refetch, 1500);
  const schedule = () => (model.byKey.size > 3000 ? slow() : fast());
  const redraw = throttle(() => { renderSummary(); tree.refresh(); }, 100);

  function renderDoc() {
    const d = doc;
    const split = d.split || {};
    const cp = d.completionPolicy || {};
    const cancelNote = h('span.error');
    const cancel = TERMINAL.has(d.state) ? null : h('button', { type: 'button', dataset: { testid: 'cancel' }, on: { click: async (ev) => {
      ev.target.disabled = true;
      try {
        await api('/v1/documents/' + encodeURIComponent(id) + ':cancel', { method: 'POST', body: {} });
        schedule();
      } catch (e) {
        ev.target.disabled = false;
        cancelNote.textContent = explain(e);
      }
    } } }, 'Cancel');
    clear(head,
      h('div.title', h('h2', d.displayName || d.id), h('span', { dataset: { testid: 'doc-state', state: d.state } }, chip(d.state)), cancel, cancelNote),
      h('dl.facts',
        fact('id', h('span.mono', d.id)), fact('size', bytes(d.sizeBytes)), fact('content type', d.contentType),
        fact('sha-256', h('span.mono', { title: d.checksum }, (d.checksum || '').slice(0, 16) + '…')),
        fact('split', (!split.strategy || split.strategy === 'SPLIT_STRATEGY_UNSPECIFIED' ? 'default' : split.strategy.replace(/^SPLIT_/, '').toLowerCase()) + (split.chunkBytes ? ' · ' + bytes(split.chunkBytes) + ' chunks' : '') + (split.maxDepth ? ' · depth ≤ ' + split.maxDepth : '')),
        fact('processor', split.processor || 'passthrough'),
        fact('policy', (cp.mode || 'STRICT').toLowerCase() + (cp.onFailure ? ' · on failure ' + cp.onFailure.toLowerCase() : '') + (cp.maxRetries ? ' · ' + cp.maxRetries + ' retries' : '')),
        fact('metadata', Object.entries(d.metadata || {}).map(([k, v]) => k + '=' + v).join(', ') || '—'),
        fact('created', time(d.createTime)), fact('finished', time(d.finishTime) || '—'), fact('rev', d.rev)));
    el.dataset.state = d.state;
    renderSummary();
    tree.refresh();
    clear(digests, (d.digests || []).length ? h('h3', 'Scope digests') : null,
      (d.digests || []).map((g) => h('div.digest-row', { dataset: { verified: String(!!g.verified) } },
        h('span.digest.' + (g.verified ? 'verified' : 'mismatch'), g.verified ? '✓ verified' : '✗ mismatch'),
        ' scope ' + (g.scopeId || 0) + ': ' + num(g.entitiesSucceeded) + ' of ' + num(g.entitiesProcessed) + ' succeeded, ' +
        num(g.entitiesFailed) + ' failed, ' + num(g.entitiesDeferred) + ' deferred · merkle ',
        h('span.mono', (g.merkleRoot || '').slice(0, 16) + '…'))));
    renderClaims();
    renderResult();
    renderFailure();
  }

  function renderSummary() {
    const s = model.summary();
    clear(summary,
      h('div.summary-line', h('strong', { dataset: { testid: 'entity-total' } }, num(s.n) + (s.n === 1 ? ' entity' : ' entities')), ' ',
        Object.entries(s.total).sort().map(([st, n]) => h('span.count', { dataset: { status: st } }, chip(st), ' ' + num(n)))),
      statusBar(s.total, s.n),
      h('table.groups', [...s.groups].slice(0, MAX_GROUPS).map(([g, v]) => h('tr', h('td', g), h('td.num', num(v.n)), h('td.wide', statusBar(v.by, v.n))))),
      s.groups.size > MAX_GROUPS ? h('p.muted', '… and ' + num(s.groups.size - MAX_GROUPS) + ' more scopes') : null);
    summary.dataset.complete = String(s.total.COMPLETE || 0);
    summary.dataset.total = String(s.n);
  }

  function renderClaims() {
    const list = [...(doc.claimChecks || [])].sort((a, b) => (a.scopeId || 0) - (b.scopeId || 0) || a.entityId - b.entityId || a.claimId.localeCompare(b.claimId));
    if (!list.length) {
      clear(claims, h('p.muted', 'No claim checks: none of this document\'s entities was DEFERRED.'));
      return;
    }
    clear(claims, h('table.list.claims-table', h('thead', h('tr', ['Claim', 'Entity', 'State', 'Expires', ''].map((t) => h('th', t)))),
      h('tbody', list.map(claimRow))));
  }

  // notRedeemable says why claim c cannot be redeemed now ('' when it can):
  // only an ISSUED claim of a running document, before its expiry.
  function notRedeemable(c) {
    if (c.state === 'CANCELLED') return 'Cancelled: the document ended before the claim was redeemed.';
    if (c.state === 'EXPIRED') return 'Expired: the claim can no longer be redeemed.';
    if (c.state === 'REDEEMED') return 'Redeemed' + (c.redeemTime ? ' at ' + time(c.redeemTime) : '') + '.';
    if (c.state !== 'ISSUED') return '';
    if (TERMINAL.has(doc.state)) return 'The document is ' + doc.state.toLowerCase().replace(/_/g, ' ') + ': nothing waits for this claim.';
    if (c.expireTime && new Date(c.expireTime) <= new Date()) return 'Expired: the claim can no longer be redeemed.';
    return '';
  }

  function claimRow(c) {
    const outcome = h('span.outcome', { dataset: { testid: 'claim-outcome' } });
    const show = (cls, result, text) => {
      outcomes.set(c.claimId, { cls, result, text });
      outcome.className = 'outcome ' + cls;
      outcome.dataset.result = result;
      outcome.textContent = text;
    };
    if (outcomes.has(c.claimId)) {
      const o = outcomes.get(c.claimId);
      show(o.cls, o.result, o.text);
    }
    const cells = [h('td.mono', c.claimId), h('td', 'entity ' + c.entityId + ' · scope ' + (c.scopeId || 0)),
      h('td', chip(c.state)), h('td.muted', time(c.expireTime))];
    // Redeem is offered only for a claim that can be redeemed; otherwise
    // the row says why (or keeps this page's last outcome for it).
    const why = notRedeemable(c);
    if (why) {
      return h('tr', { dataset: { claim: c.claimId, state: c.state } }, cells,
        h('td', outcomes.has(c.claimId) ? outcome : h('span.muted', { dataset: { testid: 'claim-note' } }, why)));
    }
    const btn = h('button.primary', { type: 'button', dataset: { testid: 'redeem', claim: c.claimId } }, 'Redeem');
    btn.addEventListener('click', async () => {
      btn.disabled = true;
      show('', 'PENDING', 'redeeming…');
      try {
        const r = await api('/v1/claims/' + encodeURIComponent(c.claimId) + ':redeem', { method: 'POST', body: {} });
        show('ok', r.state, 'Redeemed (' + r.state.toLowerCase() + ' at ' + time(r.redeemTime) + '): the entity resumes.');
        schedule();
      } catch (e) {
        show('error', e.reason || 'ERROR', e.reason === 'CLAIM_ALREADY_REDEEMED' ? 'Already redeemed: a claim resumes its entity exactly once.'
          : e.reason === 'CLAIM_EXPIRED' ? 'Expired: the claim can no longer be redeemed.'
            : e.reason === 'CLAIM_CANCELLED' ? 'Cancelled: the document ended before the claim was redeemed.' : explain(e));
      }
    });
    return h('tr', { dataset: { claim: c.claimId, state: c.state } }, cells, h('td', btn, ' ', outcome));
  }

  function renderResult() {
    const ok = doc.state === 'SUCCEEDED' || doc.state === 'PARTIALLY_SUCCEEDED';
    if (!ok) {
      resultShownFor = '';
      clear(result, h('p.muted', TERMINAL.has(doc.state) ? 'No result: the document did not succeed.' : 'The result is available when the document succeeds.'));
      return;
    }
    if (resultShownFor === doc.id) return;
    resultShownFor = doc.id;
    const preview = h('pre.preview', { dataset: { testid: 'preview' } });
    const dl = h('button.primary', { type: 'button', dataset: { testid: 'download' } }, 'Download');
    const pv = h('button', { type: 'button', dataset: { testid: 'preview-button' } }, 'Preview');
    const note = h('span.muted');
    dl.addEventListener('click', () => download(note));
    pv.addEventListener('click', () => showPreview(preview, note));
    clear(result, h('p', bytes(doc.resultSizeBytes), ' rehydrated', doc.state === 'PARTIALLY_SUCCEEDED' ? ' (partial: some entities did not complete)' : ''),
      h('div.actions', pv, dl, note), preview);
    if (Number(doc.resultSizeBytes || 0) <= PREVIEW_BYTES) showPreview(preview, note);
  }

  async function showPreview(pre, note) {
    try {
      const resp = await fetchResult(id);
      const type = resp.headers.get('Content-Type') || '';
      const reader = resp.body.getReader();
      const parts = [];
      let n = 0;
      while (n < PREVIEW_BYTES) {
        const { done, value } = await reader.read();
        if (done) break;
        parts.push(value);
        n += value.length;
      }
      const complete = n < PREVIEW_BYTES || (await reader.read()).done;
      reader.cancel().catch(() => {});
      const buf = new Uint8Array(n);
      let o = 0;
      for (const p of parts) { buf.set(p, o); o += p.length; }
      pre.textContent = render(buf.subarray(0, PREVIEW_BYTES), type, complete);
      pre.dataset.type = type;
      note.textContent = type + (complete ? '' : ' · first ' + bytes(PREVIEW_BYTES) + ' shown');
    } catch (e) {
      note.textContent = explain(e);
    }
  }

  async function download(note) {
    const name = (doc.displayName || doc.id) + '.result';
    if (!getToken()) {
      // No token to send: let the browser stream the download to disk.
      const a = h('a', { href: '/v1/documents/' + encodeURIComponent(id) + '/result', download: name });
      document.body.append(a);
      a.click();
      a.remove();
      note.textContent = 'download started';
      return;
    }
    // A bearer token needs fetch (a link cannot send the header): the
    // result is read into memory first.
    note.textContent = 'downloading…';
    try {
      const resp = await fetchResult(id);
      const blob = await resp.blob();
      const url = URL.createObjectURL(blob);
      const a = h('a', { href: url, download: name });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60000);
      note.textContent = 'downloaded ' + bytes(blob.size);
      note.dataset.downloaded = String(blob.size);
    } catch (e) {
      note.textContent = explain(e);
    }
  }

  function renderFailure() {
    if (doc.state !== 'FAILED' && doc.state !== 'CANCELLED' && !doc.error) {
      clear(failure);
      failure.hidden = true;
      return;
    }
    failure.hidden = false;
    const failed = model.order.filter((e) => (e.status === 'FAILED' || e.status === 'ABANDONED') && e.message).slice(0, 5);
    clear(failure, h('div.panel.bad',
      h('h2', doc.state === 'CANCELLED' ? 'Cancelled' : 'Why it failed'),
      h('p.why', { dataset: { testid: 'why' } }, inWords(doc)),
      doc.error ? h('p.mono.muted', doc.error) : null,
      failed.length ? h('ul', failed.map((e) => h('li', 'entity ' + e.id + ' (scope ' + e.scope + ', chunk #' + e.chunk + '): ' + e.message))) : null));
  }

  function onEvent(kind, ev) {
    events.push([kind, ev]);
    if (kind === '#status') {
      if (!model.setStatus(ev.scopeId, ev.entityId, ev.entityStatus)) schedule();
      redraw();
    } else {
      schedule();
    }
    renderTimelineSoon();
  }
  const renderTimelineSoon = throttle(() => renderTimeline(), 250);

  function renderTimeline() {
    const shown = showStatus.checked ? events : events.filter(([k]) => k !== '#status');
    const tail = shown.slice(-TIMELINE_ROWS);
    const atEnd = timelineList.scrollTop + timelineList.clientHeight >= timelineList.scrollHeight - 4;
    clear(timelineList, tail.map(([k, ev]) => h('li', { dataset: { kind: k } },
      h('span.mono.muted', shortTime(ev.time)), h('span.mono.muted', ev.seq ? '#' + ev.seq : ''), h('span.kind', k), describe(k, ev))));
    if (atEnd) timelineList.scrollTop = timelineList.scrollHeight; // follow the newest unless scrolled back
    timelineNote.textContent = !shown.length ? 'No events of this document in the retained window yet (the log prunes old events).'
      : shown.length > TIMELINE_ROWS ? 'showing the latest ' + TIMELINE_ROWS + ' of ' + num(shown.length) + ' events' : num(shown.length) + ' events';
  }

  const stream = new EventStream({ cursor: 0, documentId: id, onEvent, onState: (s, d) => { setLive(s, d); if (s === 'live') { schedule(); renderTimelineSoon(); } } });
  refetch();
  return {
    el, title: id,
    dispose() {
      disposed = true;
      stream.close();
      for (const t of [fast, slow, redraw, renderTimelineSoon]) t.cancel();
    },
  };
}

function fact(k, v) {
  return [h('dt', k), h('dd', v ?? '')];
}

/** describe renders one event as a sentence. */
export function describe(kind, ev) {
  switch (kind) {
    case '#status': return 'entity ' + ev.entityId + ' (scope ' + (ev.scopeId || 0) + ') → ' + entityStatus(ev.entityStatus).toLowerCase() + (ev.message ? ': ' + ev.message : '');
    case '#document': return 'document → ' + String(ev.state || '').toLowerCase() + (ev.message ? ': ' + ev.message : '');
    case '#claim': return 'claim ' + ev.claimId + ' ' + (ev.claimAction || '') + (ev.entityId ? ' for entity ' + ev.entityId : '') + (ev.message ? ': ' + ev.message : '');
    case '#info': return (ev.name || 'info') + ': ' + (ev.message || '');
    default: return [ev.name, ev.message].filter(Boolean).join(': ');
  }
}

/** inWords explains a failed document's error to a person. */
export function inWords(doc) {
  const err = doc.error || '';
  if (doc.state === 'CANCELLED') return 'The document was cancelled before it finished; its unfinished entities were abandoned.';
  const rules = [
    [/amplification ratio|ENTITY_TOO_LARGE|too large/i, 'The peer refused the document as too large or split into too many pieces (at most 1,000 chunks per MB of content): use larger chunks.'],
    [/completion policy/i, 'Not enough of the document\'s pieces completed for its completion policy to accept the result.'],
    [/claim.*expir|EXPIRED/i, 'A deferred piece was never redeemed before its claim check expired.'],
    [/digest|checksum|sha-?256|mismatch/i, 'The rehydrated data did not match what was sent: a checksum or digest did not verify, so the result was not committed.'],
    [/dispatch attempts|re-dispatch/i, 'The gateway lost its peer session too many times while processing this document.'],
    [/streamed result/i, 'The result was streamed back in parts and the parts did not line up, so the result was discarded.'],
    [/timeout|timed out/i, 'A piece took longer than the policy\'s timeout.'],
    [/peer reported FAILED/i, 'The peer\'s processor "' + ((doc.split && doc.split.processor) || 'passthrough') +
      '" failed the document, and its completion policy had no retry, skip or deferral to fall back on.'],
  ];
  for (const [re, words] of rules) if (re.test(err)) return words;
  return err ? 'The document failed: ' + err : 'The document failed without a reason from the peer.';
}

function render(buf, type, complete) {
  const text = new TextDecoder('utf-8', { fatal: false }).decode(buf);
  const bad = (text.match(/\uFFFD|[\x00-\x08\x0E-\x1F]/g) || []).length;
  if (bad > text.length / 50) return hexdump(buf.subarray(0, 1024)) + (buf.length > 1024 ? '\n…' : '');
  if (/json/i.test(type) && complete) {
    try { return JSON.stringify(JSON.parse(text), null, 2); } catch { /* as text */ }
  }
  return text;
}

function hexdump(b) {
  const lines = [];
  for (let i = 0; i < b.length; i += 16) {
    const row = [...b.subarray(i, i + 16)];
    lines.push(i.toString(16).padStart(6, '0') + '  ' + row.map((x) => x.toString(16).padStart(2, '0')).join(' ').padEnd(48) + '  ' +
      row.map((x) => (x >= 32 && x < 127 ? String.fromCharCode(x) : '.')).join(''));
  }
  return lines.join('\n');
}
