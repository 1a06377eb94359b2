import { describe, expect, it } from '@jest/globals';
import { formatHostPort, HostPortError, parseHostPort } from './host-port.js';

describe('parseHostPort', () => {
  it('splits IPv4 addresses and host names', () => {
    expect(parseHostPort('127.0.0.1:8000')).toEqual({ host: '127.0.0.1', port: 8000 });
    expect(parseHostPort('localhost:0')).toEqual({ host: 'localhost', port: 0 });
    expect(parseHostPort('bim-1.longhorn-system.svc:8001')).toEqual({ host: 'bim-1.longhorn-system.svc', port: 8001 });
    expect(parseHostPort(' 10.0.0.2:65535 ')).toEqual({ host: '10.0.0.2', port: 65535 });
  });

  it('takes an IPv6 address in brackets, and gives it without them', () => {
    expect(parseHostPort('[::1]:8000')).toEqual({ host: '::1', port: 8000 });
    expect(parseHostPort('[fd00::2:3]:443')).toEqual({ host: 'fd00::2:3', port: 443 });
  });

  it('drops a scheme only when asked', () => {
    expect(parseHostPort('http://127.0.0.1:8000', { allowScheme: true })).toEqual({ host: '127.0.0.1', port: 8000 });
    expect(parseHostPort('https://[::1]:8000', { allowScheme: true })).toEqual({ host: '::1', port: 8000 });
    expect(() => parseHostPort('http://127.0.0.1:8000')).toThrow(HostPortError);
  });

  it('uses the default host for an empty one, and refuses an empty host without a default', () => {
    expect(parseHostPort(':9500', { defaultHost: '0.0.0.0' })).toEqual({ host: '0.0.0.0', port: 9500 });
    expect(() => parseHostPort(':9500', { what: 'receiver address' })).toThrow('invalid receiver address ":9500": missing host');
  });

  it('refuses a missing port with an error naming the address and what it is for', () => {
    expect(() => parseHostPort('127.0.0.1', { what: '--listen' })).toThrow('invalid --listen "127.0.0.1": missing port (expected host:port, or [ipv6]:port)');
    expect(() => parseHostPort('127.0.0.1:')).toThrow('invalid address "127.0.0.1:": missing port');
    expect(() => parseHostPort('[::1]')).toThrow('missing port');
    expect(() => parseHostPort('')).toThrow('missing port');
  });

  it('refuses ports that are not numbers from 0 to 65535', () => {
    expect(() => parseHostPort('h:65536')).toThrow('port "65536" is not a number from 0 to 65535');
    expect(() => parseHostPort('h:-1')).toThrow('port "-1" is not a number');
    expect(() => parseHostPort('h:80a')).toThrow('port "80a" is not a number');
    expect(() => parseHostPort('h: 80')).toThrow('is not a number');
  });

  it('refuses IPv6 without brackets and malformed brackets', () => {
    expect(() => parseHostPort('::1:8000')).toThrow('too many colons (an IPv6 address needs brackets)');
    expect(() => parseHostPort('[::1:8000')).toThrow('missing "]"');
    expect(() => parseHostPort('[::1]8000')).toThrow('missing port');
    expect(() => parseHostPort('[example.com]:80')).toThrow('"example.com" in brackets is not an IPv6 address');
    expect(() => parseHostPort('a]:80')).toThrow('unexpected "]"');
  });
});

describe('formatHostPort', () => {
  it('brackets IPv6 hosts and round-trips through parseHostPort', () => {
    expect(formatHostPort('10.0.0.1', 80)).toBe('10.0.0.1:80');
    expect(formatHostPort('::1', 80)).toBe('[::1]:80');
    for (const a of ['10.0.0.1:80', '[fd00::1]:8002', 'node-1:9500']) {
      const { host, port } = parseHostPort(a);
      expect(formatHostPort(host, port)).toBe(a);
    }
  });
});
