// Preloaded into the controller-manager by `controller-manager-scale.mjs --memory-log <file>` (node --import):
// appends one JSON line every BIS_MEMLOG_INTERVAL_MS (default 2000) with process.memoryUsage() and the V8 heap
// statistics (used/total/malloced/external), in MiB, so RSS can be split into JS heap, external, array buffers
// and the rest (native / malloc). The timer is unref'd: it never keeps the process alive.
import { appendFileSync } from 'node:fs';
import v8 from 'node:v8';

const file = process.env.BIS_MEMLOG_FILE;
if (file) {
  const mib = (b) => +(b / 1048576).toFixed(1);
  const t0 = Date.now();
  // Time spent in GC pauses (ms) by kind, and the CPU time of the process.
  const { PerformanceObserver, constants } = await import('node:perf_hooks');
  const gcMs = { minor: 0, major: 0, other: 0 };
  new PerformanceObserver((list) => {
    for (const e of list.getEntries()) {
      const k = e.detail?.kind;
      gcMs[k === constants.NODE_PERFORMANCE_GC_MINOR ? 'minor' : k === constants.NODE_PERFORMANCE_GC_MAJOR ? 'major' : 'other'] += e.duration;
    }
  }).observe({ entryTypes: ['gc'] });
  const sample = () => {
    const m = process.memoryUsage();
    const h = v8.getHeapStatistics();
    const spaces = Object.fromEntries(v8.getHeapSpaceStatistics().map((s) => [s.space_name, mib(s.space_used_size)]));
    appendFileSync(file, JSON.stringify({
      s: Math.round((Date.now() - t0) / 1000), rss: mib(m.rss), heapTotal: mib(m.heapTotal), heapUsed: mib(m.heapUsed),
      external: mib(m.external), arrayBuffers: mib(m.arrayBuffers), malloced: mib(h.malloced_memory),
      peakMalloced: mib(h.peak_malloced_memory), spaces,
      gcMs: { minor: Math.round(gcMs.minor), major: Math.round(gcMs.major), other: Math.round(gcMs.other) },
      cpuS: +((process.cpuUsage().user + process.cpuUsage().system) / 1e6).toFixed(1),
    }) + '\n');
  };
  setInterval(sample, Number(process.env.BIS_MEMLOG_INTERVAL_MS ?? 2000)).unref();
  process.on('exit', sample);
}

// BIS_ALLOC_PROFILE_FILE: sample allocations (V8 sampling heap profiler) including the objects a major GC collected
// later, i.e. the garbage that lived long enough to be promoted to the old generation and makes the heap grow; the
// .heapprofile (Chrome DevTools format) is written when the process exits.
const allocFile = process.env.BIS_ALLOC_PROFILE_FILE;
if (allocFile) {
  const { Session } = await import('node:inspector');
  const { writeFileSync } = await import('node:fs');
  const session = new Session();
  session.connect();
  session.post('HeapProfiler.startSampling', { samplingInterval: 256 * 1024, includeObjectsCollectedByMajorGC: true, includeObjectsCollectedByMinorGC: false });
  process.on('exit', () => {
    session.post('HeapProfiler.stopSampling', (err, res) => {
      if (!err) writeFileSync(allocFile, JSON.stringify(res.profile));
    });
  });
}
