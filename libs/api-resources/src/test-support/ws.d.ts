// `ws` (installed with @fastify/websocket) ships no types; the test uses this much of its client.
declare module 'ws' {
  export default class WebSocket {
    constructor(url: string);
    on(event: 'message', listener: (data: Buffer, isBinary: boolean) => void): this;
    close(): void;
  }
}
