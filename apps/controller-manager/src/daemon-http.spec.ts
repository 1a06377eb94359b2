import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { CONTROLLER_KINDS, KubeApiDouble, TestDaemonSetKind } from '@bis/kube/testing';
import { runDaemonCli, type DaemonHandle } from './daemon.js';

const NS = 'bis-test';

/** The daemon's HTTP side in one process: the health endpoint the chart's probes call and the web UI. */
describe('controller-manager daemon: /v1/healthz and the web UI', () => {
  let api: KubeApiDouble;
  let dir: string;
  let handle: DaemonHandle | undefined;
  const err: string[] = [];

  beforeAll(async () => {
    api = await KubeApiDouble.start({ kinds: CONTROLLER_KINDS });
    dir = await mkdtemp(path.join(os.tmpdir(), 'bis-cm-daemon-http-'));
    const ui = path.join(dir, 'ui');
    await mkdir(path.join(ui, 'assets'), { recursive: true });
    await writeFile(path.join(ui, 'index.html'), '<!doctype html><title>Backing images</title><script type="module" src="/assets/app-1234.js"></script>');
    await writeFile(path.join(ui, 'assets', 'app-1234.js'), 'console.log("ui");');
    const kubeconfig = path.join(dir, 'kubeconfig');
    await writeFile(
      kubeconfig,
      JSON.stringify({
        apiVersion: 'v1',
        kind: 'Config',
        clusters: [{ name: 'double', cluster: { server: api.url, 'insecure-skip-tls-verify': true } }],
        users: [{ name: 'double', user: { token: api.token } }],
        contexts: [{ name: 'double', context: { cluster: 'double', user: 'double' } }],
        'current-context': 'double',
      }),
    );
    const io = { out: () => undefined, err: (l: string) => err.push(l) };
    const r = await runDaemonCli(
      [
        '--namespace', NS, '--node-id', 'node-1', '--listen', '127.0.0.1:0', '--backing-image-manager-image', 'bim:1',
        '--kubeconfig', kubeconfig, '--default-settings', path.join(dir, 'none.yaml'), '--default-data-path', path.join(dir, 'data'),
        '--ui-dir', ui,
      ],
      io,
    );
    if (typeof r === 'number') throw new Error(`daemon exited ${r}: ${err.join('\n')}`);
    handle = r;
  }, 60_000);
  afterAll(async () => {
    await handle?.stop();
    await api.stop();
    await rm(dir, { recursive: true, force: true });
  });

  it('serves the UI index to a browser and its assets, next to the JSON API', async () => {
    const url = handle!.url;
    const index = await fetch(`${url}/`, { headers: { accept: 'text/html' } });
    expect(index.status).toBe(200);
    expect(index.headers.get('content-type')).toContain('text/html');
    expect(await index.text()).toContain('<title>Backing images</title>');
    // A client-side route of the UI gets index.html too.
    expect(await (await fetch(`${url}/backingimages`, { headers: { accept: 'text/html' } })).text()).toContain('<title>Backing images</title>');
    const asset = await fetch(`${url}/assets/app-1234.js`);
    expect(asset.status).toBe(200);
    expect(asset.headers.get('content-type')).toContain('text/javascript');
    expect(asset.headers.get('cache-control')).toContain('immutable');
    expect(await asset.text()).toBe('console.log("ui");');
    // The API is still the API.
    expect((await fetch(`${url}/v1/settings`)).status).toBe(200);
  });

  it('answers /v1/healthz 200 while the store and controllers are up, 503 once the controllers stop', async () => {
    const res = await fetch(`${handle!.url}/v1/healthz`);
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ status: 'ok', checks: { store: 'ok', controllers: 'ok' } });
    await handle!.controllers.stop();
    const down = await fetch(`${handle!.url}/v1/healthz`);
    expect(down.status).toBe(503);
    expect(await down.json()).toEqual({ status: 'unavailable', checks: { store: 'ok', controllers: 'controllers are not running' } });
  });

  it('warns and serves no UI when the directory has no index.html', async () => {
    const io = { out: () => undefined, err: (l: string) => err.push(l) };
    // The same flags as above, with an empty UI directory: the daemon starts; the UI is not served.
    const empty = path.join(dir, 'empty-ui');
    await mkdir(empty);
    const r = await runDaemonCli(
      ['--namespace', NS, '--node-id', 'node-2', '--listen', '127.0.0.1:0', '--backing-image-manager-image', 'bim:1', '--kubeconfig', path.join(dir, 'kubeconfig'),
        '--default-settings', path.join(dir, 'none.yaml'), '--default-data-path', path.join(dir, 'data2'), '--ui-dir', empty],
      io,
    );
    if (typeof r === 'number') throw new Error(`daemon exited ${r}`);
    try {
      expect(err.join('\n')).toContain(`web UI not served: ${empty} has no index.html`);
      // `/` is then only the API's JSON root, never an HTML page.
      expect((await fetch(`${r.url}/`, { headers: { accept: 'text/html' } })).headers.get('content-type') ?? '').not.toContain('text/html');
    } finally {
      await r.stop();
    }
  }, 60_000);

  it("refuses to start beside Longhorn's controllers, with a message that says why", async () => {
    const io = { out: () => undefined, err: (l: string) => err.push(l) };
    await api.store.create(TestDaemonSetKind, { apiVersion: 'apps/v1', kind: 'DaemonSet', metadata: { name: 'longhorn-manager', namespace: 'longhorn-system', labels: { app: 'longhorn-manager' } }, spec: {} });
    try {
      const started = runDaemonCli(
        ['--namespace', NS, '--node-id', 'node-3', '--listen', '127.0.0.1:0', '--backing-image-manager-image', 'bim:1', '--kubeconfig', path.join(dir, 'kubeconfig'),
          '--default-settings', path.join(dir, 'none.yaml'), '--default-data-path', path.join(dir, 'data3')],
        io,
      );
      await expect(started).rejects.toThrow('Longhorn is installed in this cluster (DaemonSet longhorn-system/longhorn-manager labelled app=longhorn-manager)');
    } finally {
      await api.store.delete(TestDaemonSetKind, 'longhorn-manager', 'longhorn-system');
    }
  }, 60_000);
});
