import { backupTargetOperations } from '@bis/backupstore';
import { parseHostPort } from '@bis/net-address';
import { readFile, stat } from 'node:fs/promises';
import path from 'node:path';
import { parseArgs } from 'node:util';
import Fastify, { type FastifyInstance } from 'fastify';
import { parse as parseYaml } from 'yaml';
import { KubeConfig } from '@kubernetes/client-node';
import { ControllerManager, ensureDefaultBackupTarget, SettingName, SettingsReader } from '@bis/controllers';
import { createLogger, lineStream, type RootLogger } from '@bis/logging';
import { ActivityObserver, BackingImageMetrics, metricsPlugin } from '@bis/metrics';
import { readTokenFile } from '@bis/internal-auth';
import {
  DEFAULT_MANAGER_POD_SELECTOR,
  INTERNAL_TOKEN_SECRET,
  KubeDataPlane,
  KubeDatastore,
  KubeEventRecorder,
  KubeSecretStore,
  NodeDiskReporter,
  NodeHealthMonitor,
  assertNoLonghorn,
  ensureInternalTokenSecret,
  podSettingsFromStore,
} from '@bis/kube';
import { annotationEndpoints, backingImageHttpPlugin, downloadUrlPolicyFor, eventResource, registerBackingImageResources } from '@bis/api-resources';
import { ApiRegistry, controllersHealthCheck, registerHealthz, restApiPlugin, settingsResource, SettingsService, storeHealthCheck } from '@bis/rest-api';
import { uiServerPlugin } from '@bis/ui-server';
import { defaultUiDir, type CliIo } from './cli.js';

export const DAEMON_USAGE = `usage: controller-manager daemon --datastore kubernetes --namespace <ns> --node-id <node>
       --backing-image-manager-image <image> [--listen 0.0.0.0:9500] [--service-account <sa>]
       [--default-settings <file>] [--default-data-path <dir>] [--log-format plain|json] [--log-level debug|info|warn|error] [--kubeconfig <file>] [--disk-check-interval <seconds>]
       [--manager-pod-selector <label selector>] [--internal-token-secret <name>] [--internal-token-file <file>]
       [--allow-unauthenticated-internal-calls] [--ui-dir <dir>]
       [--allow-source-hosts <hosts or CIDRs, comma-separated>]
       [--default-backup-target <url>] [--default-backup-target-credential-secret <name>] [--default-backupstore-poll-interval <seconds>]

Runs the controllers of one node in Kubernetes mode (the chart's DaemonSet): objects in the Kubernetes API, manager
and data-source pods, this node's disks reported, every Longhorn node marked down or up from its Kubernetes node and
manager pod (--manager-pod-selector, default ${DEFAULT_MANAGER_POD_SELECTOR}), the REST API and the web UI (--ui-dir, default the built apps/ui/dist next to this app) on --listen, with
GET /v1/healthz (200 when the store answers and the controllers run, else 503; no token) for the probes. Without --kubeconfig the in-cluster
service account (or $KUBECONFIG) is used.

Internal calls (to manager and data-source pods) carry the system's internal token, kept in the Secret
--internal-token-secret (default ${INTERNAL_TOKEN_SECRET}, key "token") of --namespace: created with a random token
when missing, mounted read-only into every manager and data-source pod. --internal-token-file reads the controller's
copy of the token from a file instead (the Secret is then neither read nor created, and must hold the same token).
--allow-unauthenticated-internal-calls (or the setting allow-unauthenticated-internal-calls=true) lets new pods also
admit callers that send no token (Longhorn's Go components).

A download URL must name a public address: one that is loopback, private, link-local or otherwise internal is refused
when the backing image is created, unless its host or a CIDR holding its address is in --allow-source-hosts (also
passed to the data-source pods, whose downloads check the same list).

The backup target "default" is created at the first start with --default-backup-target (default empty: no target
yet), --default-backup-target-credential-secret (a Secret of --namespace) and --default-backupstore-poll-interval
(default 300), the chart's defaultBackupStore values; once it exists, what the user sets is kept.

What the controllers do and why something fails is recorded as Kubernetes Events on the involved object
(\`kubectl describe lhbi <name>\`), also listed by the REST API at /v1/events.

The daemon refuses to start when Longhorn's manager DaemonSet (label app=longhorn-manager) exists in any namespace:
both systems act on the same longhorn.io objects.`;

export interface DaemonHandle {
  url: string;
  events: KubeEventRecorder;
  controllers: ControllerManager;
  store: KubeDatastore;
  dataPlane: KubeDataPlane;
  disks: NodeDiskReporter;
  health: NodeHealthMonitor;
  /** What `GET /metrics` serves. */
  metrics: BackingImageMetrics;
  stop(): Promise<void>;
}

/** Longhorn's default-setting.yaml: `setting-name: value` lines (values are strings; null means "built-in"). */
export async function readDefaultSettings(file: string): Promise<Record<string, string>> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return {};
    throw err;
  }
  const doc = parseYaml(text) as unknown;
  if (doc === null || doc === undefined) return {};
  if (typeof doc !== 'object' || Array.isArray(doc)) throw new Error(`${file}: expected a map of setting names to values`);
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(doc as Record<string, unknown>)) {
    if (v === null || v === undefined) continue;
    if (typeof v === 'object') throw new Error(`${file}: setting ${k} must be a scalar value`);
    out[k] = String(v);
  }
  return out;
}

function parseListen(listen: string): { host: string; port: number } {
  return parseHostPort(listen, { what: '--listen', defaultHost: '0.0.0.0' });
}

/** The daemon's log on stderr (`io.err`): pino JSON lines (`json`) or pino-pretty's readable lines (`plain`). */
function makeLogger(format: 'plain' | 'json', level: 'debug' | 'info' | 'warn' | 'error', nodeID: string, io: CliIo): RootLogger {
  return createLogger({
    component: 'controller-manager',
    level,
    bindings: { node: nodeID },
    outputs: [{ destination: { stream: lineStream((l) => io.err(l)) }, format: format === 'json' ? 'json' : 'pretty', colorize: false }],
  });
}

/** Parses the `daemon` command line and starts the node's controllers; returns an exit code on usage errors. */
export async function runDaemonCli(argv: readonly string[], io: CliIo): Promise<DaemonHandle | number> {
  if (argv.some((a) => a === '--help' || a === '-h')) {
    io.out(DAEMON_USAGE);
    return 0;
  }
  let values;
  try {
    ({ values } = parseArgs({
      args: [...argv],
      options: {
        datastore: { type: 'string', default: 'kubernetes' },
        namespace: { type: 'string', default: 'longhorn-system' },
        'node-id': { type: 'string' },
        listen: { type: 'string', default: '0.0.0.0:9500' },
        'backing-image-manager-image': { type: 'string' },
        'service-account': { type: 'string', default: 'backing-image-system' },
        'default-settings': { type: 'string', default: '/etc/backing-image-system/default-setting.yaml' },
        'default-data-path': { type: 'string' },
        'log-format': { type: 'string', default: 'plain' },
        'log-level': { type: 'string', default: 'info' },
        kubeconfig: { type: 'string' },
        'disk-check-interval': { type: 'string', default: '30' },
        'manager-pod-selector': { type: 'string', default: DEFAULT_MANAGER_POD_SELECTOR },
        'internal-token-secret': { type: 'string', default: INTERNAL_TOKEN_SECRET },
        'internal-token-file': { type: 'string' },
        'allow-unauthenticated-internal-calls': { type: 'boolean', default: false },
        'ui-dir': { type: 'string', default: defaultUiDir() },
        'allow-source-hosts': { type: 'string', default: '' },
        'default-backup-target': { type: 'string', default: '' },
        'default-backup-target-credential-secret': { type: 'string', default: '' },
        'default-backupstore-poll-interval': { type: 'string', default: '300' },
      },
      strict: true,
    }));
  } catch (err) {
    io.err(`controller-manager daemon: ${(err as Error).message}\n${DAEMON_USAGE}`);
    return 2;
  }
  const usage = (m: string) => {
    io.err(`controller-manager daemon: ${m}\n${DAEMON_USAGE}`);
    return 2;
  };
  if (values.datastore !== 'kubernetes') return usage(`unsupported --datastore "${values.datastore}": only "kubernetes" (use "controller-manager standalone" for the embedded store)`);
  const nodeID = values['node-id'] ?? process.env['NODE_NAME'] ?? '';
  if (!nodeID) return usage('--node-id is required (the chart passes $(NODE_NAME))');
  const image = values['backing-image-manager-image'];
  if (!image) return usage('--backing-image-manager-image is required');
  const format = values['log-format'];
  if (format !== 'plain' && format !== 'json') return usage(`invalid --log-format "${format}": plain or json`);
  const level = values['log-level'];
  if (level !== 'debug' && level !== 'info' && level !== 'warn' && level !== 'error') return usage(`invalid --log-level "${level}": debug, info, warn or error`);
  const interval = Number(values['disk-check-interval']);
  if (!Number.isFinite(interval) || interval <= 0) return usage(`invalid --disk-check-interval "${values['disk-check-interval']}": seconds > 0`);
  const tokenSecret = values['internal-token-secret']!;
  if (!/^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/.test(tokenSecret) || tokenSecret.length > 253) return usage(`invalid --internal-token-secret "${tokenSecret}": a Kubernetes object name`);
  const pollSeconds = Number(values['default-backupstore-poll-interval']);
  if (!Number.isInteger(pollSeconds) || pollSeconds < 0) return usage(`invalid --default-backupstore-poll-interval "${values['default-backupstore-poll-interval']}": whole seconds >= 0`);
  const credentialSecret = values['default-backup-target-credential-secret']!;
  if (credentialSecret && (!/^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/.test(credentialSecret) || credentialSecret.length > 253)) return usage(`invalid --default-backup-target-credential-secret "${credentialSecret}": a Kubernetes object name`);
  const defaultBackupTarget = { backupTargetURL: values['default-backup-target']!, credentialSecret, pollInterval: goDuration(pollSeconds) };
  const allowSourceHosts = values['allow-source-hosts']!.split(',').map((s) => s.trim()).filter(Boolean);
  const listen = parseListen(values.listen!);
  const namespace = values.namespace!;
  const log = makeLogger(format, level, nodeID, io);

  const kubeConfig = new KubeConfig();
  if (values.kubeconfig) kubeConfig.loadFromFile(values.kubeconfig);
  else kubeConfig.loadFromDefault();
  // Both systems act on the same longhorn.io objects: never run beside Longhorn's controllers.
  await assertNoLonghorn(kubeConfig);
  const defaults = await readDefaultSettings(values['default-settings']!);
  let internalToken: string;
  if (values['internal-token-file']) {
    internalToken = await readTokenFile(values['internal-token-file']);
    log.info(`internal token read from ${values['internal-token-file']}; pods mount secret ${tokenSecret}, which must hold the same token`);
  } else {
    const s = await ensureInternalTokenSecret({ kubeConfig, namespace, name: tokenSecret });
    log.info(`internal token ${s.created ? 'created in' : 'read from'} secret ${tokenSecret} in namespace ${namespace}`);
    internalToken = s.token;
  }
  const allowUnauthenticated = values['allow-unauthenticated-internal-calls']!;
  if (allowUnauthenticated) log.warn('--allow-unauthenticated-internal-calls: manager and data-source pods admit internal callers that send no token');

  const store = new KubeDatastore({ kubeConfig, defaultNamespace: namespace });
  const dataPlane = new KubeDataPlane({
    kubeConfig,
    backupTarget: backupTargetOperations,
    settings: { namespace, serviceAccountName: values['service-account']!, internalTokenSecret: tokenSecret, allowUnauthenticatedInternalCalls: allowUnauthenticated, allowSourceHosts },
    settingsProvider: podSettingsFromStore(store, namespace),
    managerImage: image,
    internalToken,
  });
  const settings = new SettingsService({ store, namespace });
  const disks = new NodeDiskReporter({ store, namespace, nodeID, defaultDataPath: values['default-data-path'] ?? defaults['default-data-path'] ?? '/var/lib/longhorn/', intervalMs: interval * 1000, log });
  const health = new NodeHealthMonitor({ kubeConfig, store, namespace, managerPodSelector: values['manager-pod-selector'], log });
  const events = new KubeEventRecorder({ kubeConfig, namespace, host: nodeID, log: (l, type) => (type === 'Warning' ? log.warn(l) : log.info(l)) });
  const secrets = new KubeSecretStore({ kubeConfig, namespace });
  const metrics = new BackingImageMetrics({ store, namespace, ownerID: nodeID });
  const observer = new ActivityObserver({ store, namespace, log, metrics, ownerID: nodeID });
  const controllers = new ControllerManager({
    store, dataPlane, nodeID, namespace, log, events, secrets, allowSourceHosts,
    controllerMetrics: (name) => metrics.controllerMetrics(name),
  });
  let app: FastifyInstance | undefined;
  // Shutting down: a part that fails to stop is logged, and the others are still stopped.
  const stopFailed = (what: string) => (err: unknown) =>
    log.warn(`shutdown: ${what} did not stop cleanly: ${err instanceof Error ? err.message : String(err)}`);
  const cleanup = async () => {
    await app?.close().catch(stopFailed('the HTTP server'));
    await observer.stop().catch(stopFailed('the activity observer'));
    await health.stop().catch(stopFailed('the node health monitor'));
    await controllers.stop().catch(stopFailed('the controllers'));
    await events.flush().catch(stopFailed('the event recorder'));
    await disks.stop().catch(stopFailed('the node disk reporter'));
    dataPlane.close();
    await store.close();
    await log.close();
  };
  try {
    // Longhorn's manager applies default-setting.yaml to settings that do not exist yet; the image is its flag.
    for (const [name, value] of Object.entries(defaults)) {
      if (name === 'default-data-path') continue; // used for this node's default disk, not a setting here
      if ((await settings.get(name))?.applied) continue;
      try {
        await settings.set(name, value, { system: true });
      } catch (err) {
        log.warn(`default setting ${name}=${value} not applied: ${(err as Error).message}`);
      }
    }
    await settings.ensureDefaults({ [SettingName.DefaultBackingImageManagerImage]: image }, (name, err) => log.warn(`default setting ${name} not created: ${err.message}`));
    await settings.set(SettingName.DefaultBackingImageManagerImage, image, { system: true });
    if (await ensureDefaultBackupTarget(store, namespace, defaultBackupTarget)) {
      log.info(`created the backup target default (${defaultBackupTarget.backupTargetURL || 'no URL yet'}, poll interval ${defaultBackupTarget.pollInterval})`);
    }
    await disks.start();
    await health.start();
    await observer.start();
    await controllers.start();

    const registry = new ApiRegistry().addResource(settingsResource(settings));
    const api = registerBackingImageResources(registry, {
      store,
      namespace,
      settings: new SettingsReader(store, namespace),
      endpoints: annotationEndpoints((address) => dataPlane.managerClient(address)),
      // The same policy as standalone: a URL outside --allow-source-hosts is refused at create time.
      downloadUrlPolicy: downloadUrlPolicyFor(allowSourceHosts),
      internalToken,
      observer: metrics,
    });
    registry.addResource(eventResource(events));
    app = Fastify({ logger: false, bodyLimit: 1 << 20 });
    await app.register(backingImageHttpPlugin, { api });
    await app.register(restApiPlugin, { registry });
    registerHealthz(app, { checks: [storeHealthCheck(store, namespace), controllersHealthCheck(() => controllers.isRunning)] });
    const uiDir = path.resolve(values['ui-dir']!);
    if (await stat(path.join(uiDir, 'index.html')).then((s) => s.isFile(), () => false)) await app.register(uiServerPlugin, { root: uiDir });
    else log.warn(`web UI not served: ${uiDir} has no index.html`);
    await app.register(metricsPlugin, { metrics });
    await app.listen({ host: listen.host, port: listen.port });
    const addr = app.server.address();
    const port = typeof addr === 'object' && addr ? addr.port : listen.port;
    const url = `http://${listen.host.includes(':') ? `[${listen.host}]` : listen.host}:${port}`;
    io.out(`backing-image system (kubernetes, node ${nodeID}, namespace ${namespace}) is running; REST API ${url}/v1`);
    let stopped: Promise<void> | undefined;
    return { url, events, controllers, store, dataPlane, disks, health, metrics, stop: () => (stopped ??= cleanup()) };
  } catch (err) {
    await cleanup();
    throw err;
  }
}

/** Seconds as a Go duration string, as Longhorn writes a poll interval (300 → `5m0s`, 0 → `0s`). */
function goDuration(seconds: number): string {
  const h = Math.floor(seconds / 3600);
  const m = Math.floor((seconds % 3600) / 60);
  const sec = seconds % 60;
  return h ? `${h}h${m}m${sec}s` : m ? `${m}m${sec}s` : `${sec}s`;
}
