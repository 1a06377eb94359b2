import v8 from 'node:v8';
import { runStandaloneCli } from './cli.js';

// V8 lets the old generation grow to up to 4x what survived the last full GC before the next one; the controllers
// replace big objects at every write (a manager's spec and status list every file of its disk), so most of that
// headroom fills with dead object versions (1,000 images: 90-135 MiB live, 290-380 MiB of heap). The growth factor
// is set to 1 + BIS_HEAP_GROWING_PERCENT/100, 1.5 by default (V8's --heap-growing-percent; full GCs run more often,
// measured in docs/benchmarks.md, controller-manager); BIS_HEAP_GROWING_PERCENT=0 leaves V8's dynamic factor.
const heapGrowingPercent = Number(process.env.BIS_HEAP_GROWING_PERCENT ?? 50);
if (Number.isInteger(heapGrowingPercent) && heapGrowingPercent > 0) v8.setFlagsFromString(`--heap-growing-percent=${heapGrowingPercent}`);

// The daemon mode (and the Kubernetes client it brings: about 50 MiB of RSS) is loaded only when it runs.
const runDaemonCli: typeof import('./daemon.js').runDaemonCli = async (...args) => (await import('./daemon.js')).runDaemonCli(...args);

const io = { out: (l: string) => process.stdout.write(`${l}\n`), err: (l: string) => process.stderr.write(`${l}\n`) };

const argv = process.argv.slice(2);
(argv[0] === 'daemon' ? runDaemonCli(argv.slice(1), io) : runStandaloneCli(argv, io)).then(
  (result) => {
    if (typeof result === 'number') process.exit(result);
    let stopping = false;
    const onSignal = (sig: string) => {
      if (stopping) return;
      stopping = true;
      io.out(`received ${sig}: stopping the API, the controllers and ${argv[0] === 'daemon' ? 'the watches (the manager and data-source pods keep running)' : 'every data-plane process'}`);
      result.stop().then(
        () => {
          io.out('stopped');
          process.exit(0);
        },
        (err: unknown) => {
          io.err(`stop failed: ${(err as Error).message}`);
          process.exit(1);
        },
      );
    };
    process.on('SIGINT', () => onSignal('SIGINT'));
    process.on('SIGTERM', () => onSignal('SIGTERM'));
  },
  (err: unknown) => {
    io.err(`controller-manager: ${(err as Error).message}`);
    process.exit(1);
  },
);
