import http from 'node:http';

/** One HTTP request to 127.0.0.1:`port` (body optional); resolves with the status code once the answer is read. */
export function httpStatus(port: number, method: string, path: string, body?: Buffer): Promise<number> {
  return new Promise<number>((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, method, path }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode!));
    });
    req.on('error', reject);
    req.end(body);
  });
}
