import S3rver from 's3rver';

export interface S3TestServer {
  port: number;
  endpoint: string;
  /** Stops listening and cuts every open connection, like a crashed server. */
  stop(): Promise<void>;
}

export const S3_TEST_CREDENTIAL = { AWS_ACCESS_KEY_ID: 'S3RVER', AWS_SECRET_ACCESS_KEY: 'S3RVER' } as const;

/** A real S3-protocol server (s3rver) on loopback, storing into `directory`. `port` 0 picks a free port. */
export async function startS3Server(directory: string, bucket: string, port = 0): Promise<S3TestServer> {
  // serviceEndpoint 'invalid': a request for host `s3.invalid` (which never resolves, RFC 2606, so only a proxy can
  // reach this server by that name) is path-style, like one for 127.0.0.1.
  const server = new S3rver({ port, address: '127.0.0.1', silent: true, directory, serviceEndpoint: 'invalid', configureBuckets: [{ name: bucket }] });
  const addr = await server.run();
  return {
    port: addr.port,
    endpoint: `http://127.0.0.1:${addr.port}`,
    stop: async () => {
      const closing = server.close();
      server.httpServer?.closeAllConnections();
      await closing;
    },
  };
}
