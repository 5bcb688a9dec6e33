// A minimal CBOR (RFC 8949) decoder for the event stream's frames: every
// WebSocket message is two CBOR items, a header {op, t} and a payload
// (draft-holmgren-at-synchronization-00 "Frame Format"). Definite lengths
// only (the gateway encodes deterministically); tags are skipped.

const utf8 = new TextDecoder('utf-8', { fatal: true });

/** decodeItem returns [value, nextOffset] for the item at offset. */
export function decodeItem(bytes, offset = 0) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let pos = offset;
  const need = (n) => {
    if (pos + n > bytes.length) throw new Error('CBOR: truncated item');
  };
  const readArg = (info) => {
    if (info < 24) return info;
    const sizes = { 24: 1, 25: 2, 26: 4, 27: 8 };
    const n = sizes[info];
    if (!n) throw new Error('CBOR: indefinite or reserved length ' + info);
    need(n);
    let v;
    if (n === 1) v = view.getUint8(pos);
    else if (n === 2) v = view.getUint16(pos);
    else if (n === 4) v = view.getUint32(pos);
    else {
      const big = view.getBigUint64(pos);
      v = big <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(big) : big;
    }
    pos += n;
    return v;
  };
  const item = () => {
    need(1);
    const ib = bytes[pos++];
    const major = ib >> 5;
    const info = ib & 31;
    if (major === 7) return simple(info);
    const arg = readArg(info);
    switch (major) {
      case 0: return arg;
      case 1: return typeof arg === 'bigint' ? -1n - arg : -1 - arg;
      case 2: { need(arg); const b = bytes.slice(pos, pos + arg); pos += arg; return b; }
      case 3: { need(arg); const s = utf8.decode(bytes.subarray(pos, pos + arg)); pos += arg; return s; }
      case 4: { const a = []; for (let i = 0; i < arg; i++) a.push(item()); return a; }
      case 5: {
        const m = {};
        for (let i = 0; i < arg; i++) { const k = item(); m[k] = item(); }
        return m;
      }
      case 6: return item(); // tag: the tagged value
      default: throw new Error('CBOR: bad major type');
    }
  };
  const simple = (info) => {
    switch (info) {
      case 20: return false;
      case 21: return true;
      case 22: return null;
      case 23: return undefined;
      case 25: { need(2); const v = half(view.getUint16(pos)); pos += 2; return v; }
      case 26: { need(4); const v = view.getFloat32(pos); pos += 4; return v; }
      case 27: { need(8); const v = view.getFloat64(pos); pos += 8; return v; }
      default: throw new Error('CBOR: unsupported simple value ' + info);
    }
  };
  const v = item();
  return [v, pos];
}

function half(h) {
  const exp = (h >> 10) & 0x1f;
  const frac = h & 0x3ff;
  const sign = h & 0x8000 ? -1 : 1;
  if (exp === 0) return sign * 2 ** -14 * (frac / 1024);
  if (exp === 31) return frac ? NaN : sign * Infinity;
  return sign * 2 ** (exp - 15) * (1 + frac / 1024);
}

/** decodeFrame splits one event-stream message into {header, payload}. */
export function decodeFrame(buf) {
  const bytes = buf instanceof Uint8Array ? buf : new Uint8Array(buf);
  const [header, next] = decodeItem(bytes, 0);
  const [payload, end] = decodeItem(bytes, next);
  if (end !== bytes.length) throw new Error('CBOR: bytes after the frame payload');
  return { header, payload };
}
