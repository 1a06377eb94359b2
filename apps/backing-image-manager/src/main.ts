import { parseArgs } from 'node:util';
import { DEFAULT_DISK_PATH } from '@bis/sync-service';
import { LOCK_TIMING_ENV, lockTimingFromEnv } from '@bis/backupstore';
import { readTokenFile } from '@bis/internal-auth';
import { createLogger, messageLog } from '@bis/logging';
import { startDaemon } from './daemon.js';
import { exitWithParent } from '@bis/runtime';
import { parseHostPort } from '@bis/net-address';

// Started by the standalone controller-manager: stop when it is gone (no orphan keeps the disk or its ports).
exitWithParent();

const USAGE = `usage: backing-image-manager daemon --listen <host:port> --sync-listen <host:port> --disk-path <dir>
       [--disk-uuid <uuid>] [--port-range 30001-31000] [--advertise-address <ip>] [--allow-source-host <host>]...
       [--watch-interval-ms 1000] [--monitor-interval-ms 2000]
       [--scrub-interval <seconds, default 604800; 0 = off>] [--scrub-bandwidth <bytes/s, default 52428800>]
       [--internal-token-file <file> [--allow-unauthenticated-internal-calls]]
environment: ${Object.values(LOCK_TIMING_ENV).join(', ')} (backupstore lock timing in ms; default Longhorn's)`;

async function main(argv: string[]): Promise<number> {
  // Longhorn's manager pod runs `backing-image-manager --debug daemon …`: the global flag comes before the command
  // (accepted there as after it; the log has no separate debug level).
  while (argv[0] === '--debug') argv = argv.slice(1);
  const [command, ...rest] = argv;
  if (argv.some((a) => a === '--help' || a === '-h') || command === 'help') {
    process.stdout.write(`${USAGE}\n`);
    return 0;
  }
  if (command !== 'daemon') {
    process.stderr.write(`${USAGE}\n`);
    return 2;
  }
  const { values } = parseArgs({
    args: rest,
    options: {
      listen: { type: 'string', default: 'localhost:8000' },
      'sync-listen': { type: 'string', default: 'localhost:8001' },
      'disk-path': { type: 'string', default: DEFAULT_DISK_PATH },
      'disk-uuid': { type: 'string' },
      'port-range': { type: 'string', default: '30001-31000' },
      'advertise-address': { type: 'string' },
      'allow-source-host': { type: 'string', multiple: true, default: [] },
      'watch-interval-ms': { type: 'string', default: '1000' },
      'monitor-interval-ms': { type: 'string', default: '2000' },
      'scrub-interval': { type: 'string', default: String(7 * 24 * 3600) },
      'scrub-bandwidth': { type: 'string', default: String(50 * 1024 * 1024) },
      'internal-token-file': { type: 'string' },
      'allow-unauthenticated-internal-calls': { type: 'boolean', default: false },
      debug: { type: 'boolean', default: false },
    },
    strict: true,
  });
  const tokenFile = values['internal-token-file'];
  if (values['allow-unauthenticated-internal-calls'] && !tokenFile) {
    process.stderr.write('backing-image-manager: --allow-unauthenticated-internal-calls needs --internal-token-file\n');
    return 2;
  }
  const scrubInterval = Number(values['scrub-interval']);
  const scrubBandwidth = Number(values['scrub-bandwidth']);
  if (!Number.isSafeInteger(scrubInterval) || scrubInterval < 0) {
    process.stderr.write(`backing-image-manager: invalid --scrub-interval ${values['scrub-interval']}: must be a whole number of seconds >= 0\n`);
    return 2;
  }
  if (!Number.isSafeInteger(scrubBandwidth) || scrubBandwidth < 1) {
    process.stderr.write(`backing-image-manager: invalid --scrub-bandwidth ${values['scrub-bandwidth']}: must be a whole number of bytes per second >= 1\n`);
    return 2;
  }
  const internalAuth = tokenFile
    ? { token: await readTokenFile(tokenFile), allowUnauthenticated: values['allow-unauthenticated-internal-calls'] }
    : undefined;
  // JSON lines on stderr (the runtime appends them to the manager's log file; in Kubernetes, the container log).
  const logger = createLogger({
    component: 'backing-image-manager',
    bindings: { diskPath: values['disk-path'], ...(values['disk-uuid'] ? { diskUUID: values['disk-uuid'] } : {}) },
  });
  const log = messageLog(logger);
  const advertise = values['advertise-address'] ?? process.env['POD_IP'] ?? listenHost(values.listen!);
  const daemon = await startDaemon({
    listen: values.listen!,
    syncListen: values['sync-listen']!,
    diskPath: values['disk-path']!,
    diskUUID: values['disk-uuid'],
    portRange: values['port-range']!,
    advertiseHost: advertise,
    allowSourceHosts: values['allow-source-host']!,
    watchIntervalMs: Number(values['watch-interval-ms']),
    monitorIntervalMs: Number(values['monitor-interval-ms']),
    scrub: { intervalMs: scrubInterval * 1000, bandwidthBytesPerSecond: scrubBandwidth },
    backupLockTiming: lockTimingFromEnv(process.env),
    internalAuth,
    log,
  });
  process.stdout.write(`${JSON.stringify({ ready: true, grpcPort: daemon.grpcPort, syncPort: daemon.syncPort })}\n`);
  await new Promise<void>((resolve) => {
    const onSignal = (sig: string) => {
      log(`received ${sig}, stopping`);
      daemon.stop().then(resolve, (err: unknown) => {
        log(`stop failed: ${(err as Error).message}`);
        resolve();
      });
    };
    process.once('SIGTERM', () => onSignal('SIGTERM'));
    process.once('SIGINT', () => onSignal('SIGINT'));
  });
  return 0;
}

function listenHost(listen: string): string {
  const { host } = parseHostPort(listen, { what: '--listen', defaultHost: '' });
  return host === '' || host === '0.0.0.0' || host === '::' ? '127.0.0.1' : host === 'localhost' ? '127.0.0.1' : host;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`backing-image-manager: ${(err as Error).message}\n`);
    process.exit(1);
  },
);
