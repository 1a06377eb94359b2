import { parseArgs } from 'node:util';
import { parseHostPort } from '@bis/net-address';
import { httpAuthHook, readTokenFile, type InternalAuth } from '@bis/internal-auth';
import { createLogger, messageLog } from '@bis/logging';
import { CREDENTIAL_ENV, runDataSource } from './cli.js';

const USAGE = `usage: backing-image-data-source host --listen host:port --logs-dir dir [--max-instances n]
       [--internal-token-file file [--allow-unauthenticated-internal-calls]]

Runs several data sources in one process (each with its own ports and log file <logs-dir>/<name>.log), started and
stopped over the control API at --listen (the standalone data plane's data-source hosts).`;

/** Runs a data-source host until SIGINT/SIGTERM. Returns an exit code. */
export async function runDataSourceHostCli(argv: readonly string[]): Promise<number> {
  if (argv.some((a) => a === '--help' || a === '-h')) {
    process.stdout.write(`${USAGE}\n`);
    return 0;
  }
  let values;
  try {
    ({ values } = parseArgs({
      args: [...argv],
      options: {
        listen: { type: 'string' },
        'logs-dir': { type: 'string' },
        'max-instances': { type: 'string', default: '8' },
        'internal-token-file': { type: 'string' },
        'allow-unauthenticated-internal-calls': { type: 'boolean', default: false },
      },
      strict: true,
    }));
  } catch (e) {
    process.stderr.write(`backing-image-data-source host: ${(e as Error).message}\n${USAGE}\n`);
    return 2;
  }
  const { listen: listenFlag, 'logs-dir': logsDir, 'internal-token-file': tokenFile } = values;
  const allowUnauthenticated = values['allow-unauthenticated-internal-calls'] === true;
  const maxInstances = Number(values['max-instances']);
  if (!listenFlag || !logsDir || !Number.isInteger(maxInstances) || maxInstances < 1 || maxInstances > 256) {
    process.stderr.write(`backing-image-data-source host: --listen and --logs-dir are required, --max-instances is 1 to 256\n${USAGE}\n`);
    return 2;
  }
  let listen;
  let auth: InternalAuth | undefined;
  try {
    listen = parseHostPort(listenFlag, { what: '--listen', defaultHost: '127.0.0.1' });
    if (allowUnauthenticated && !tokenFile) throw new Error('--allow-unauthenticated-internal-calls needs --internal-token-file');
    auth = tokenFile ? { token: await readTokenFile(tokenFile), allowUnauthenticated } : undefined;
  } catch (e) {
    process.stderr.write(`backing-image-data-source host: ${(e as Error).message}\n`);
    return 2;
  }
  const env = { ...process.env };
  delete process.env[CREDENTIAL_ENV];
  delete env[CREDENTIAL_ENV];
  const log = messageLog(createLogger({ component: 'backing-image-data-source-host', bindings: { listen: listenFlag } }));
  const [{ DataSourceHost }, { dataSourceHostRoutes, HOST_SERVER_OPTIONS }, { default: Fastify }, { SharedInstanceServers }] = await Promise.all([
    import('@bis/data-source/host'),
    import('@bis/data-source-api/host'),
    import('fastify'),
    import('@bis/data-source'),
  ]);
  // the instances' servers share fastify apps built once (each instance keeps its own ports)
  const servers = new SharedInstanceServers();
  const host = new DataSourceHost({ run: (argv, io) => runDataSource(argv, { ...io, servers }), logsDir, maxInstances, env, log });
  const app = Fastify({ ...HOST_SERVER_OPTIONS, logger: false, forceCloseConnections: true });
  app.addHook('onRequest', httpAuthHook(auth, { onRefused: (req, reason) => log(`refused ${req.url}: ${reason}`) }));
  await app.register(dataSourceHostRoutes, { host });
  await app.listen({ host: listen.host, port: listen.port });
  log(`data-source host listening on ${listenFlag}, at most ${maxInstances} instances; internal calls ${auth ? 'need the token' : 'are NOT authenticated (no --internal-token-file)'}`);
  await new Promise<void>((resolve) => {
    process.once('SIGINT', () => resolve());
    process.once('SIGTERM', () => resolve());
  });
  log('shutting down: stopping every instance');
  await host.close();
  await servers.close();
  await app.close();
  return 0;
}
