import type net from 'node:net';

/**
 * Relays bytes both ways between two connected sockets, as a TCP proxy does, and makes sure both are released:
 * once either side is closed the other is ended, read to its end (a paused reader would never see the peer's FIN or
 * reset, and would hold its descriptor for good) and destroyed at the latest `lingerMs` later. An error on either
 * side destroys both.
 */
export function relay(a: net.Socket, b: net.Socket, lingerMs = 5000): void {
  const kill = (): void => {
    a.destroy();
    b.destroy();
  };
  a.on('error', kill);
  b.on('error', kill);
  const release = (s: net.Socket): void => {
    if (s.destroyed) return;
    s.resume();
    s.end();
    setTimeout(() => s.destroy(), lingerMs).unref();
  };
  a.once('close', () => release(b));
  b.once('close', () => release(a));
  a.pipe(b).pipe(a);
}
