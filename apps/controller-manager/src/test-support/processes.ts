import { readdirSync, readFileSync } from 'node:fs';

/** A process of the machine as /proc shows it. */
export interface Proc {
  pid: number;
  ppid: number;
  /** One letter: `R`, `S`, `Z` (zombie), … */
  state: string;
  args: string[];
}

/** Every process on the machine (read from /proc; one that ends while it is read is left out). */
export function processes(): Proc[] {
  const out: Proc[] = [];
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const st = readFileSync(`/proc/${d}/stat`, 'utf8');
      const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
      const args = readFileSync(`/proc/${d}/cmdline`, 'utf8').split('\0').filter(Boolean);
      out.push({ pid: Number(d), ppid: Number(f[1]), state: f[0]!, args });
    } catch {
      // ended meanwhile
    }
  }
  return out;
}
