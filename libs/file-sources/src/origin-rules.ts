import { lookup as dnsLookup, type LookupAddress, type LookupAllOptions, type LookupOneOptions } from 'node:dns';
import type { SourceHostPolicy } from './ip-policy.js';

// Rules for reaching a download origin that both HTTP paths share (got's and the direct one of direct-get.ts).

type LookupCallback = (err: NodeJS.ErrnoException | null, address: string | LookupAddress[], family?: number) => void;

/** A `lookup` for sockets that refuses addresses the policy does not allow (checked at every connect). */
export function guardedLookup(policy: SourceHostPolicy) {
  return (hostname: string, options: LookupOneOptions | LookupAllOptions | number, callback: LookupCallback): void => {
    const opts: LookupAllOptions = { ...(typeof options === 'number' ? { family: options } : options), all: true };
    const wantAll = typeof options === 'object' && options.all === true;
    dnsLookup(hostname, opts, (err, addresses) => {
      if (err) return callback(err, []);
      try {
        for (const a of addresses) policy.check(hostname, a.address);
      } catch (e) {
        return callback(e as NodeJS.ErrnoException, []);
      }
      if (wantAll) return callback(null, addresses);
      const first = addresses[0];
      if (!first) return callback(Object.assign(new Error(`no address for ${hostname}`), { code: 'ENOTFOUND' }), []);
      callback(null, first.address, first.family);
    });
  };
}

export async function resolveAll(hostname: string): Promise<string[]> {
  return new Promise((resolve, reject) =>
    dnsLookup(hostname, { all: true }, (err, a) => (err ? reject(err) : resolve(a.map((x) => x.address)))),
  );
}

export function matchesNoProxy(hostname: string, noProxy: string | undefined): boolean {
  if (!noProxy) return false;
  const h = hostname.toLowerCase();
  return noProxy
    .split(',')
    .map((s) => s.trim().toLowerCase())
    .filter(Boolean)
    .some((e) => e === '*' || h === e.replace(/^\./, '') || h.endsWith(e.startsWith('.') ? e : `.${e}`));
}
