import { afterAll, describe, expect, it } from '@jest/globals';
import net from 'node:net';
import { ControlPlane, envtestAssets } from './testing/envtest.js';

/**
 * The test control plane starts etcd and the API server on ports checked free just before; another process may bind
 * one of them first. Needs KUBEBUILDER_ASSETS; skipped otherwise.
 */
const assets = envtestAssets();
if (!assets.dir) console.warn(`envtest-start.envtest.spec.ts skipped: ${assets.reason}`);
const describeEnv = assets.dir ? describe : describe.skip;

function listen(): Promise<net.Server> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => resolve(srv));
  });
}
const portOf = (srv: net.Server): number => (srv.address() as net.AddressInfo).port;

describeEnv('the test control plane', () => {
  const held: net.Server[] = [];
  let cp: ControlPlane | undefined;
  afterAll(async () => {
    await cp?.stop();
    for (const s of held) s.close();
  }, 60_000);

  it('starts etcd and the API server again on new ports when a port was taken before they bound it', async () => {
    // etcd's client port and the API server's port are each taken once, as if by another test's process
    const takenForEtcd = await listen();
    const takenForApi = await listen();
    held.push(takenForEtcd, takenForApi);
    const picked: number[] = [];
    const free = async (): Promise<number> => {
      const s = await listen();
      const p = portOf(s);
      await new Promise<void>((r) => s.close(() => r()));
      return p;
    };
    let calls = 0;
    cp = await ControlPlane.start({
      pickPort: async () => {
        calls++;
        // calls 1-2: etcd (client, peer), first try; 3-4: etcd again; 5: the API server, first try; 6: again
        const p = calls === 1 ? portOf(takenForEtcd) : calls === 5 ? portOf(takenForApi) : await free();
        picked.push(p);
        return p;
      },
    });
    expect(calls).toBe(6);
    const apiPort = Number(new URL(cp.url).port);
    expect(apiPort).toBe(picked[5]);
    expect(apiPort).not.toBe(portOf(takenForApi));
    const ready = await cp.request('GET', '/readyz');
    expect(ready).toEqual({ status: 200, body: 'ok' });
  }, 240_000);
});
