// Reads the gateway's Prometheus text (/metrics, public) into
// {name: [{labels, value}]} for the gauges the API does not report.
export async function fetchMetrics() {
  const resp = await fetch('/metrics');
  if (!resp.ok) throw new Error('/metrics: HTTP ' + resp.status);
  return parseMetrics(await resp.text());
}

export function parseMetrics(text) {
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line[0] === '#') continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    if (m[2]) for (const [, k, v] of m[2].matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[k] = v;
    (out[m[1]] ||= []).push({ labels, value: Number(m[3]) });
  }
  return out;
}

/** sum adds up a metric over its labels (0 when absent). */
export function sum(metrics, name) {
  return (metrics[name] || []).reduce((a, s) => a + s.value, 0);
}
