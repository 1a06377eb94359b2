// Child of data-source-download.mjs: one download through the built @bis/file-sources, checksum verified.
import { createFileSources } from '@bis/file-sources';
const [url, dest, sha512] = process.argv.slice(2);
const sources = createFileSources({ allowSourceHosts: ['127.0.0.1'] });
const t = process.hrtime.bigint();
const r = await sources.download({ url, dest, expectedChecksum: sha512, signal: new AbortController().signal, sink: { setSize() {}, updateProgress() {} } });
const seconds = Number(process.hrtime.bigint() - t) / 1e9;
if (r.sha512 !== sha512) throw new Error('checksum differs');
console.log(JSON.stringify({ seconds, maxRssKiB: process.resourceUsage().maxRSS, size: r.size }));
