import { runDataSourceCli } from './cli.js';
import { exitWithParent } from '@bis/runtime';

// Started by the standalone controller-manager: stop when it is gone (no orphan keeps the disk or its ports).
exitWithParent();

const argv = process.argv.slice(2);
// `host`: several data sources in one process (the standalone data plane's hosts); otherwise one data source.
const run = argv[0] === 'host' ? import('./host-cli.js').then((m) => m.runDataSourceHostCli(argv.slice(1))) : runDataSourceCli(argv);
run.then(
  (code) => {
    if (code !== undefined) process.exit(code);
  },
  (e: unknown) => {
    process.stderr.write(`backing-image-data-source: ${e instanceof Error ? e.message : String(e)}\n`);
    process.exit(1);
  },
);
