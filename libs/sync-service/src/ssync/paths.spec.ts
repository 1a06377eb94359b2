import { describe, it, expect } from '@jest/globals';
import { RECEIVER_SERVER_ENV, SENDFILE_ENV, receiverServerKind, sendfileSetting } from './paths.js';

describe('ssync path switches', () => {
  it('BIS_SSYNC_RECEIVER_SERVER: own by default, node-http or own when set, an explicit option wins', () => {
    expect(receiverServerKind(undefined, {})).toBe('own');
    expect(receiverServerKind(undefined, { [RECEIVER_SERVER_ENV]: '' })).toBe('own');
    expect(receiverServerKind(undefined, { [RECEIVER_SERVER_ENV]: 'node-http' })).toBe('node-http');
    expect(receiverServerKind(undefined, { [RECEIVER_SERVER_ENV]: 'own' })).toBe('own');
    expect(receiverServerKind('own', { [RECEIVER_SERVER_ENV]: 'node-http' })).toBe('own');
  });

  it('BIS_SSYNC_RECEIVER_SERVER: an unknown value is an error naming the variable and the values', () => {
    expect(() => receiverServerKind(undefined, { [RECEIVER_SERVER_ENV]: 'nginx' })).toThrow(
      'BIS_SSYNC_RECEIVER_SERVER="nginx" is not a receiver HTTP server: use own or node-http',
    );
  });

  it('BIS_SSYNC_SENDFILE: follows the addon when unset, 0 turns it off, 1 forces it', () => {
    expect(sendfileSetting(true, {})).toBe(true);
    expect(sendfileSetting(false, {})).toBe(false);
    expect(sendfileSetting(true, { [SENDFILE_ENV]: '0' })).toBe(false);
    expect(sendfileSetting(true, { [SENDFILE_ENV]: '1' })).toBe(true);
  });

  it('BIS_SSYNC_SENDFILE: 1 without sendfile support, or an unknown value, is a clear error', () => {
    expect(() => sendfileSetting(false, { [SENDFILE_ENV]: '1' })).toThrow(/BIS_SSYNC_SENDFILE=1 but the block-mapping addon is not built with sendfile/);
    expect(() => sendfileSetting(true, { [SENDFILE_ENV]: 'yes' })).toThrow('BIS_SSYNC_SENDFILE="yes" is not valid: use 1 (sendfile) or 0 (read + write)');
  });
});
