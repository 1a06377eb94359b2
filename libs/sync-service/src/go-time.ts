/**
 * Formats a UTC instant given in nanoseconds since the epoch exactly like Go's `time.Time.String()` for a UTC time:
 * `YYYY-MM-DD HH:MM:SS[.fraction] +0000 UTC`, the fraction being the nanoseconds with trailing zeros removed and
 * omitted when zero. Longhorn stores the file mtime in `backing.cfg` in this form and compares it as a string.
 */
export function formatGoTime(epochNs: bigint): string {
  const NS = 1_000_000_000n;
  let sec = epochNs / NS;
  let ns = epochNs % NS;
  if (ns < 0n) {
    ns += NS;
    sec -= 1n;
  }
  const d = new Date(Number(sec) * 1000);
  const p = (n: number, w = 2) => String(n).padStart(w, '0');
  const year = d.getUTCFullYear();
  const date = `${p(year, 4)}-${p(d.getUTCMonth() + 1)}-${p(d.getUTCDate())}`;
  const time = `${p(d.getUTCHours())}:${p(d.getUTCMinutes())}:${p(d.getUTCSeconds())}`;
  let frac = '';
  if (ns !== 0n) frac = '.' + ns.toString().padStart(9, '0').replace(/0+$/, '');
  return `${date} ${time}${frac} +0000 UTC`;
}

/** The file's mtime as Go's `time.Time.String()` (nanosecond precision from a bigint stat). */
export function formatMtime(stat: { mtimeNs: bigint }): string {
  return formatGoTime(stat.mtimeNs);
}
