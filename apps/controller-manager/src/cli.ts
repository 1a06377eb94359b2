import { mkdir } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { createLogger, lineStream } from '@bis/logging';
import { readTokenFile } from '@bis/internal-auth';
import { checkRestExposure, startStandalone, type StandaloneHandle } from '@bis/standalone';

export const USAGE = `usage: controller-manager standalone [--data-dir <dir>] [--listen <host:port>] [--disks <n>]
       [--allow-source-hosts <hosts or CIDRs, comma-separated>] [--max-data-sources <n>]
       [--data-sources-per-process <n>] [--ui-dir <dir>] [--verbose]
       [--log-format pretty|json]
       [--auth-token-file <file> | --insecure] [--internal-token-file <file>] [--allow-unauthenticated-internal-calls]

Starts the whole backing-image system on this machine (embedded store, one node with <n> disk directories,
a filesystem backup target, the controllers, the data-plane processes, the REST API and the web UI at /).
Defaults: --data-dir .data --listen 127.0.0.1:9500 --disks 3 --ui-dir <the built apps/ui/dist>
          --internal-token-file <data-dir>/internal-token (created with mode 0600 when missing)
A --listen address other than loopback needs --auth-token-file (REST and UI callers send authorization: Bearer
<token>) or an explicit --insecure.
The log is written as JSON lines to <data-dir>/logs/controller-manager.log; warnings and errors (every line with
--verbose) also go to the terminal, readable (--log-format pretty, the default on a terminal) or as JSON lines.`;

/** The data-plane binaries, next to this app in the repository (overridable for installs elsewhere). */
export function defaultBinaries(env: NodeJS.ProcessEnv = process.env): { manager: string; dataSource: string } {
  const appsDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
  return {
    manager: env['BIS_MANAGER_BIN'] ?? path.join(appsDir, 'backing-image-manager', 'bin', 'backing-image-manager.js'),
    dataSource: env['BIS_DATA_SOURCE_BIN'] ?? path.join(appsDir, 'backing-image-data-source', 'bin', 'backing-image-data-source.js'),
  };
}

/** The built web UI, next to this app in the repository (apps/ui/dist). */
export function defaultUiDir(): string {
  return path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', 'ui', 'dist');
}

/** The top-level usage: the two modes. */
export const TOP_USAGE = `usage: controller-manager <mode> [options]

Modes:
  standalone   the whole system on this machine (embedded store, local processes)
  daemon       one node's controllers in a Kubernetes cluster (the Helm chart runs it)

Run "controller-manager <mode> --help" for a mode's options.`;

/** True when the arguments ask for help (`--help`, `-h`, `help`). */
export function wantsHelp(args: readonly string[]): boolean {
  return args.some((a) => a === '--help' || a === '-h');
}

export interface CliIo {
  out: (line: string) => void;
  err: (line: string) => void;
}

/** Parses the CLI, starts the standalone system and returns its handle (or an exit code for usage errors). */
export async function runStandaloneCli(argv: readonly string[], io: CliIo): Promise<StandaloneHandle | number> {
  const [command, ...rest] = argv;
  if (command === undefined || command === '--help' || command === '-h' || command === 'help') {
    (command === undefined ? io.err : io.out)(TOP_USAGE);
    return command === undefined ? 2 : 0;
  }
  if (command !== 'standalone') {
    io.err(`controller-manager: unknown mode "${command}"\n${TOP_USAGE}`);
    return 2;
  }
  if (wantsHelp(rest)) {
    io.out(USAGE);
    return 0;
  }
  let values;
  try {
    ({ values } = parseArgs({
      args: [...rest],
      options: {
        'data-dir': { type: 'string', default: '.data' },
        listen: { type: 'string', default: '127.0.0.1:9500' },
        disks: { type: 'string', default: '3' },
        'allow-source-hosts': { type: 'string', default: '' },
        'max-data-sources': { type: 'string', default: '8' },
        'data-sources-per-process': { type: 'string', default: '8' },
        'ui-dir': { type: 'string', default: defaultUiDir() },
        verbose: { type: 'boolean', default: false },
        'log-format': { type: 'string' },
        'auth-token-file': { type: 'string' },
        insecure: { type: 'boolean', default: false },
        'internal-token-file': { type: 'string' },
        'allow-unauthenticated-internal-calls': { type: 'boolean', default: false },
      },
      strict: true,
    }));
  } catch (err) {
    io.err(`controller-manager: ${(err as Error).message}\n${USAGE}`);
    return 2;
  }
  const disks = Number(values.disks);
  if (!Number.isInteger(disks) || disks < 1 || disks > 64) {
    io.err(`controller-manager: invalid --disks "${values.disks}": a number from 1 to 64`);
    return 2;
  }
  const maxDataSources = Number(values['max-data-sources']);
  if (!Number.isInteger(maxDataSources) || maxDataSources < 1) {
    io.err(`controller-manager: invalid --max-data-sources "${values['max-data-sources']}": a positive number`);
    return 2;
  }
  const perProcess = Number(values['data-sources-per-process']);
  if (!Number.isInteger(perProcess) || perProcess < 1 || perProcess > 256) {
    io.err(`controller-manager: invalid --data-sources-per-process "${values['data-sources-per-process']}": a number from 1 to 256`);
    return 2;
  }
  const logFormat = values['log-format'] ?? (process.stderr.isTTY ? 'pretty' : 'json');
  if (logFormat !== 'pretty' && logFormat !== 'json') {
    io.err(`controller-manager: invalid --log-format "${logFormat}": pretty or json`);
    return 2;
  }
  let authToken: string | undefined;
  try {
    if (values['auth-token-file']) authToken = await readTokenFile(values['auth-token-file']);
    checkRestExposure(values.listen!, { authToken, insecure: values.insecure });
  } catch (err) {
    io.err(`controller-manager: ${(err as Error).message}`);
    return 2;
  }
  const dataDir = path.resolve(values['data-dir']!);
  const logsDir = path.join(dataDir, 'logs');
  await mkdir(logsDir, { recursive: true });
  const logFile = path.join(logsDir, 'controller-manager.log');
  // One logger: JSON lines in the file (info, or debug with --verbose); the terminal gets warnings and errors (every
  // line with --verbose), readable or as JSON lines.
  const log = createLogger({
    component: 'controller-manager',
    level: values.verbose ? 'debug' : 'info',
    outputs: [
      { destination: { file: logFile } },
      { destination: { stream: lineStream((l) => io.err(l)) }, format: logFormat, level: values.verbose ? 'debug' : 'warn', colorize: logFormat === 'pretty' && process.stderr.isTTY === true },
    ],
  });
  const allow = values['allow-source-hosts']!.split(',').map((s) => s.trim()).filter(Boolean);
  const binaries = defaultBinaries();
  let handle: StandaloneHandle;
  try {
    handle = await startStandalone({
      dataDir,
      listen: values.listen!,
      disks,
      allowSourceHosts: allow,
      binaries,
      log,
      maxDataSources,
      dataSourcesPerProcess: perProcess,
      uiDir: values['ui-dir'],
      authToken,
      insecure: values.insecure,
      internalTokenFile: values['internal-token-file'],
      allowUnauthenticatedInternalCalls: values['allow-unauthenticated-internal-calls'],
    });
  } catch (err) {
    log.error(`controller-manager failed to start: ${(err as Error).message}`);
    await log.close();
    throw err;
  }
  const origStop = handle.stop;
  handle.stop = async () => {
    await origStop();
    await log.close();
  };
  io.out(`backing-image system (standalone) is running`);
  io.out(`  REST API:        ${handle.url}/v1`);
  io.out(handle.uiDir ? `  web UI:          ${handle.url}/` : `  web UI:          not served (${path.resolve(values['ui-dir']!)} has no index.html; build it with: npx nx run ui:build)`);
  io.out(`  REST auth:       ${authToken ? 'bearer token required (--auth-token-file)' : values.insecure ? 'NONE (--insecure): anyone who can reach the port controls the system' : 'none (loopback only)'}`);
  io.out(`  internal token:  ${handle.internalTokenFile}${values['allow-unauthenticated-internal-calls'] ? ' (calls without a token admitted)' : ''}`);
  io.out(`  data directory:  ${handle.dataDir}`);
  io.out(`  store:           ${handle.storeDir}`);
  for (const d of handle.disks) io.out(`  ${d.name}:          ${d.path} (disk UUID ${d.uuid})`);
  io.out(`  backup target:   ${handle.backupTargetURL}`);
  io.out(`  logs:            ${handle.logsDir} (controller-manager.log, one file per manager / data source)`);
  if (allow.length) io.out(`  download sources also allowed from: ${allow.join(', ')}`);
  io.out(`Press Ctrl-C to stop; a restart with the same --data-dir picks up where it was.`);
  return handle;
}
