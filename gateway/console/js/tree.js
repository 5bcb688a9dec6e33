// The entity tree of one document: a model that takes the full tree from
// GET /v1/documents/{id}?includeEntities=true and live #status events, and
// a virtualised view that renders only the rows in sight, so a document of
// 10,000+ entities scrolls and updates smoothly.
import { bytes, entityStatus, h, num } from './util.js';

export const ROW_HEIGHT = 24;
const MAX_HEIGHT = 480;

const key = (scope, id) => scope + ':' + id;

export class TreeModel {
  constructor() {
    this.byKey = new Map();
    this.order = []; // visible entities in depth-first, chunk order
    this.children = new Map(); // entity -> children (chunk order)
    this.collapsed = new Set();
    this.digests = new Map(); // scope -> 'verified' | 'mismatch'
    this.version = 0;
  }

  /** load replaces the tree with the entities and digests of a Document. */
  load(entities, digests) {
    const byKey = new Map();
    const byId = new Map();
    for (const raw of entities || []) {
      const e = {
        id: raw.entityId || 0, parent: raw.parentId || 0, scope: raw.scopeId || 0, depth: raw.depth || 0,
        status: entityStatus(raw.status), chunk: raw.chunkIndex || 0, offset: Number(raw.chunkOffset || 0),
        size: Number(raw.sizeBytes || 0), checksum: raw.checksum || '', attempts: raw.attempts || 0, message: raw.message || '',
      };
      byKey.set(key(e.scope, e.id), e);
      if (!byId.has(e.id)) byId.set(e.id, []);
      byId.get(e.id).push(e);
    }
    this.byKey = byKey;
    this.digests = new Map();
    for (const d of digests || []) {
      const s = d.scopeId || 0;
      const v = d.verified ? 'verified' : 'mismatch';
      if (this.digests.get(s) !== 'mismatch') this.digests.set(s, v);
    }
    this.children = new Map();
    const roots = [];
    for (const e of byKey.values()) {
      e.parentEntity = null;
      if (e.parent) {
        // Parent ids are bare 32-bit ids: prefer the entity one level up
        // (Layer 1 scopes), then one in the same scope (chunks of a root).
        const cands = (byId.get(e.parent) || []).filter((p) => p !== e);
        e.parentEntity = cands.find((p) => p.depth === e.depth - 1) || cands.find((p) => p.scope === e.scope) || cands[0] || null;
      }
      if (!e.parentEntity) roots.push(e);
      else {
        if (!this.children.has(e.parentEntity)) this.children.set(e.parentEntity, []);
        this.children.get(e.parentEntity).push(e);
      }
    }
    const byChunk = (a, b) => a.scope - b.scope || a.chunk - b.chunk || a.id - b.id;
    roots.sort(byChunk);
    for (const list of this.children.values()) list.sort(byChunk);
    for (const [parent, list] of this.children) {
      const s = list[0].scope;
      parent.childScope = s !== parent.scope ? s : null;
    }
    this.roots = roots;
    this.flatten();
  }

  flatten() {
    const out = [];
    const seen = new Set();
    const walk = (e, level) => {
      if (seen.has(e)) return; // defensive: ids reused across scopes
      seen.add(e);
      e.level = level;
      out.push(e);
      if (this.collapsed.has(key(e.scope, e.id))) return;
      for (const c of this.children.get(e) || []) walk(c, level + 1);
    };
    for (const r of this.roots || []) walk(r, 0);
    this.order = out;
    this.version++;
  }

  toggle(e) {
    const k = key(e.scope, e.id);
    if (this.collapsed.has(k)) this.collapsed.delete(k);
    else this.collapsed.add(k);
    this.flatten();
  }

  /** setStatus applies a #status event; false when the entity is unknown. */
  setStatus(scope, id, status) {
    const e = this.byKey.get(key(scope || 0, id));
    if (!e) return false;
    e.status = entityStatus(status);
    this.version++;
    return true;
  }

  /** summary counts entities by status overall and per (scope, depth). */
  summary() {
    const total = {};
    const groups = new Map();
    for (const e of this.byKey.values()) {
      total[e.status] = (total[e.status] || 0) + 1;
      const g = 'scope ' + e.scope + ' · depth ' + e.depth;
      if (!groups.has(g)) groups.set(g, { n: 0, by: {} });
      const gg = groups.get(g);
      gg.n++;
      gg.by[e.status] = (gg.by[e.status] || 0) + 1;
    }
    return { n: this.byKey.size, total, groups };
  }
}

/** statusBar is a stacked bar of counts by status. */
export function statusBar(counts, n) {
  const bar = h('div.stack');
  for (const [s, c] of Object.entries(counts).sort()) {
    const seg = h('div.seg.st-' + s, { title: s.toLowerCase() + ': ' + num(c) });
    seg.style.flexGrow = String(c);
    bar.append(seg);
  }
  if (!n) bar.append(h('div.seg.empty'));
  return bar;
}

/**
 * TreeView renders model.order through a fixed pool of row elements inside
 * a scrolling viewport (virtualisation). refresh() is cheap: it touches the
 * rows in sight only.
 */
export class TreeView {
  constructor(model) {
    this.model = model;
    this.spacer = h('div.tree-spacer');
    this.rows = h('div.tree-rows');
    this.viewport = h('div.tree-viewport', { tabindex: 0, dataset: { testid: 'tree' } }, this.spacer, this.rows);
    this.pool = [];
    this.pending = false;
    this.viewport.addEventListener('scroll', () => this.refresh());
    this.rows.addEventListener('click', (ev) => {
      const t = ev.target.closest('.toggle');
      if (!t) return;
      const e = this.model.order[Number(t.dataset.index)];
      if (e) {
        this.model.toggle(e);
        this.refresh();
      }
    });
  }

  refresh() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      this.render();
    });
  }

  render() {
    const order = this.model.order;
    const vp = this.viewport;
    this.spacer.style.height = order.length * ROW_HEIGHT + 'px';
    // Small trees get a short box; large ones scroll inside MAX_HEIGHT.
    vp.style.height = Math.min(MAX_HEIGHT, Math.max(1, order.length) * ROW_HEIGHT + 2) + 'px';
    const height = vp.clientHeight || MAX_HEIGHT;
    const first = Math.max(0, Math.floor(vp.scrollTop / ROW_HEIGHT) - 5);
    const count = Math.min(order.length - first, Math.ceil(height / ROW_HEIGHT) + 10);
    this.rows.style.transform = 'translateY(' + first * ROW_HEIGHT + 'px)';
    while (this.pool.length < count) this.pool.push(h('div.tree-row'));
    for (let i = 0; i < this.pool.length; i++) {
      const row = this.pool[i];
      if (i >= count) {
        if (row.parentNode) row.remove();
        continue;
      }
      if (!row.parentNode || row.parentNode !== this.rows) this.rows.append(row);
      this.fill(row, order[first + i], first + i);
    }
    vp.dataset.rows = String(order.length);
    vp.dataset.rendered = String(Math.max(0, count));
  }

  fill(row, e, index) {
    const kids = this.model.children.get(e);
    const collapsed = this.model.collapsed.has(key(e.scope, e.id));
    const stamp = [e.status, e.message, e.attempts, collapsed, kids ? kids.length : 0, index, e.id, e.scope, e.level].join('|');
    if (row.dataset.stamp === stamp) return;
    row.dataset.stamp = stamp;
    row.dataset.entity = String(e.id);
    row.dataset.scope = String(e.scope);
    row.dataset.status = e.status;
    row.style.paddingLeft = 8 + (e.level || 0) * 18 + 'px';
    const digest = e.childScope !== null && e.childScope !== undefined ? this.model.digests.get(e.childScope) : null;
    row.replaceChildren(...[
      kids ? h('button.toggle', { type: 'button', dataset: { index: String(index) }, title: collapsed ? 'expand' : 'collapse' }, collapsed ? '▸' : '▾') : h('span.toggle-pad'),
      h('span.chip.st-' + e.status, e.status.toLowerCase()),
      h('span.ent', e.parentEntity ? 'entity ' + e.id : 'root ' + e.id),
      h('span.muted', 'scope ' + e.scope + ' · depth ' + e.depth),
      e.parentEntity && e.parentEntity.scope === e.scope ? h('span.muted', 'chunk #' + e.chunk + ' @ ' + num(e.offset)) : null,
      e.size ? h('span.muted', bytes(e.size)) : null,
      kids ? h('span.muted', num(kids.length) + ' children') : null,
      digest ? h('span.digest.' + digest, { title: 'SCOPE_DIGEST of scope ' + e.childScope }, digest === 'verified' ? '✓ digest verified' : '✗ digest mismatch') : null,
      e.attempts > 1 ? h('span.muted', e.attempts + ' attempts') : null,
      e.checksum && !/^0+$/.test(e.checksum) ? h('span.mono.muted', { title: 'SHA-256 ' + e.checksum }, e.checksum.slice(0, 10) + '…') : null,
      e.message ? h('span.msg', { title: e.message }, e.message) : null].filter(Boolean));
  }
}
