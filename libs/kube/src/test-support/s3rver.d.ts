declare module 's3rver' {
  import type { Server } from 'node:http';
  import type { AddressInfo } from 'node:net';
  interface S3rverOptions {
    port?: number;
    address?: string;
    silent?: boolean;
    directory: string;
    configureBuckets?: { name: string }[];
    serviceEndpoint?: string;
    /** TLS: PEM key and certificate (s3rver serves HTTPS when both are given). */
    key?: string | Buffer;
    cert?: string | Buffer;
  }
  export default class S3rver {
    constructor(options: S3rverOptions);
    run(): Promise<AddressInfo>;
    close(): Promise<void>;
    httpServer?: Server;
  }
}
