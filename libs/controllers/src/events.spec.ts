import { describe, expect, it } from '@jest/globals';
import { QueuedEventSink, redactEventMessage, type EventQuery, type EventType, type InvolvedObject, type RecordedEvent } from './events.js';

const NS = 'longhorn-system';

const bi = (name: string) => ({ kind: 'BackingImage', metadata: { name, namespace: NS, uid: `uid-${name}` } });

/** A sink whose writes wait for a gate, like writes acknowledged after a slow sync; it keeps what it wrote. */
class GatedSink extends QueuedEventSink<string> {
  running = 0;
  maxRunning = 0;
  readonly written: RecordedEvent[] = [];
  private t = Date.parse('2026-01-01T00:00:00Z');

  constructor(
    private readonly gate: Promise<void>,
    opts: { maxPending: number; concurrency: number; log: (l: string, type: EventType) => void },
  ) {
    super(opts, 'stored');
  }
  protected stamp(): string {
    return new Date((this.t += 1000)).toISOString();
  }
  protected async write(source: string, obj: InvolvedObject, type: EventType, reason: string, message: string, time: string): Promise<void> {
    this.running++;
    this.maxRunning = Math.max(this.maxRunning, this.running);
    try {
      await this.gate;
      this.written.push({ id: `${obj.metadata.name}.${this.written.length}`, time, type, reason, message, source, involvedObject: { kind: obj.kind, name: obj.metadata.name }, count: 1 });
    } finally {
      this.running--;
    }
  }
  async list(_q?: EventQuery): Promise<RecordedEvent[]> {
    return [...this.written];
  }
}

describe('QueuedEventSink (events written in the background)', () => {
  it('writes the events of different objects at once (at most `concurrency`), each object in order; warnings wait where routine events are only logged', async () => {
    let open: () => void = () => {};
    const gate = new Promise<void>((resolve) => (open = resolve));
    const lines: string[] = [];
    const r = new GatedSink(gate, { maxPending: 10, concurrency: 3, log: (l, type) => lines.push(`${type} ${l}`) });
    for (let i = 0; i < 10; i++) r.record('src', bi(`o${i % 5}`), 'Normal', 'Update', `n${i}`);
    // the queue is full: a routine event is only logged, a warning still waits
    r.record('src', bi('o0'), 'Normal', 'Update', 'dropped');
    r.record('src', bi('o1'), 'Warning', 'Failed', 'disk-1: no space left on device (ENOSPC)');
    expect(r.dropped).toEqual({ Normal: 1, Warning: 0 });
    expect(lines.some((l) => /^Warning 1 event\(s\) only logged, not stored: 10 waiting already \(1 Normal and 0 Warning since the start\)$/.test(l))).toBe(true);
    expect(lines).toContain('Normal event Normal Update BackingImage/o0: dropped');
    await new Promise((resolve) => setTimeout(resolve, 20));
    expect(r.running).toBe(3);
    open();
    await r.flush();
    expect(r.maxRunning).toBe(3);
    const events = await r.list();
    expect(events.map((e) => e.message).sort()).toEqual(['disk-1: no space left on device (ENOSPC)', 'n0', 'n1', 'n2', 'n3', 'n4', 'n5', 'n6', 'n7', 'n8', 'n9']);
    // each object's events in the order recorded
    for (let o = 0; o < 5; o++) {
      const mine = events.filter((e) => e.involvedObject.name === `o${o}` && e.reason === 'Update').sort((a, b) => a.time.localeCompare(b.time));
      expect(mine.map((e) => e.message)).toEqual([`n${o}`, `n${o + 5}`]);
    }
    expect(events.find((e) => e.type === 'Warning')?.involvedObject.name).toBe('o1');
  });

  it('keeps credentials out of messages', () => {
    expect(redactEventMessage('download from https://user:pa55word@example.com/x.img failed')).toBe('download from https://***@example.com/x.img failed');
    expect(redactEventMessage('GET https://b.s3.example.com/o?X-Amz-Signature=abcdef&x=1 403')).toBe('GET https://b.s3.example.com/o?X-Amz-Signature=***&x=1 403');
    expect(redactEventMessage('got 404 from http://127.0.0.1:8080/missing')).toBe('got 404 from http://127.0.0.1:8080/missing');
  });
});
