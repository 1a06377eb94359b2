import { describe, it, expect } from '@jest/globals';
import { CHAIN_HEADER_BYTES, decodeChain, encodeChain, type Sha512Chain } from './chain.js';
import { Sha512ChainFormatError } from './errors.js';
import { Sha512ChainRecorder } from './recorder.js';
import { randomData } from './test-support/reference.js';

function recordedChain(size: number, segmentSize: number): Sha512Chain {
  const rec = new Sha512ChainRecorder(segmentSize);
  rec.updateSync(randomData(size));
  return rec.finish();
}

describe('encodeChain / decodeChain', () => {
  it.each([
    [0, 4096],
    [1, 128],
    [4096 * 3 + 5, 4096],
    [4096 * 4, 4096],
  ])('round trip of a %i-byte image in %i-byte segments', (size, segmentSize) => {
    const chain = recordedChain(size, segmentSize);
    const bytes = encodeChain(chain);
    expect(bytes.length).toBe(CHAIN_HEADER_BYTES + 64 * chain.states.length);
    expect(bytes.subarray(0, 8).toString('latin1')).toBe('BISS512C');
    const back = decodeChain(new Uint8Array(bytes));
    expect(back.size).toBe(chain.size);
    expect(back.segmentSize).toBe(chain.segmentSize);
    expect(back.checksum).toBe(chain.checksum);
    expect(back.states.map((s) => s.toString('hex'))).toEqual(chain.states.map((s) => s.toString('hex')));
  });

  it('decodes from a view into a larger buffer', () => {
    const chain = recordedChain(1000, 256);
    const bytes = encodeChain(chain);
    const big = Buffer.concat([Buffer.alloc(13, 7), bytes, Buffer.alloc(9, 7)]);
    expect(decodeChain(big.subarray(13, 13 + bytes.length)).checksum).toBe(chain.checksum);
  });

  describe('rejects bad input naming the problem', () => {
    const good = encodeChain(recordedChain(4096 * 2 + 1, 4096));
    const mutated = (f: (b: Buffer) => Buffer | void): Buffer => {
      const b = Buffer.from(good);
      return f(b) ?? b;
    };
    it.each<[string, Buffer, RegExp]>([
      ['empty input', Buffer.alloc(0), /bad magic/],
      ['bad magic', mutated((b) => void b.write('XXXX', 0, 'latin1')), /bad magic/],
      ['truncated header', good.subarray(0, 50), /truncated header: 50 bytes/],
      ['unknown version', mutated((b) => void b.writeUInt32BE(2, 8)), /unsupported version 2/],
      ['segment size not a multiple of 128', mutated((b) => void b.writeUInt32BE(1000, 12)), /multiple of 128/],
      ['segment size 0', mutated((b) => void b.writeUInt32BE(0, 12)), /segment size/],
      ['size beyond 2^53', mutated((b) => void b.writeBigUInt64BE(1n << 60n, 16)), /largest safe integer/],
      ['state count vs size', mutated((b) => void b.writeUInt32BE(2, 88)), /state count 2 does not match size 8193/],
      ['size vs state count', mutated((b) => void b.writeBigUInt64BE(4096n * 5n, 16)), /needs 5/],
      ['truncated states', good.subarray(0, good.length - 1), /truncated states/],
      ['trailing bytes', Buffer.concat([good, Buffer.alloc(3)]), /3 unexpected bytes/],
    ])('%s', (_name, bytes, message) => {
      expect(() => decodeChain(bytes)).toThrow(Sha512ChainFormatError);
      expect(() => decodeChain(bytes)).toThrow(message);
    });
    it('not a byte array', () => {
      expect(() => decodeChain('BISS512C' as unknown as Uint8Array)).toThrow(/not a byte array/);
    });
  });

  it('encodeChain refuses a chain whose state count does not fit its size', () => {
    const chain = recordedChain(4096 * 2, 4096);
    expect(() => encodeChain({ ...chain, states: chain.states.slice(1) })).toThrow(/1 states .* needs 2/);
    expect(() => encodeChain({ ...chain, checksum: 'abc' })).toThrow(/128 lowercase hex/);
    expect(() => encodeChain({ ...chain, states: [chain.states[0]!, Buffer.alloc(10)] })).toThrow(/state 1 must be 64 bytes/);
  });
});
