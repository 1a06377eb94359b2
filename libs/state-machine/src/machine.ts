/**
 * The one transition function of the code base. Every state a status or record holds is the result of
 * {@link transition}; a test (state-writes.spec.ts) checks that no code outside this library writes a state field
 * any other way.
 */

/** Raised when an event is not allowed in the current state; names the machine, the object, the state and the event. */
export class IllegalTransitionError extends Error {
  override readonly name = 'IllegalTransitionError';
  constructor(
    readonly machine: string,
    readonly from: string,
    readonly event: string,
    readonly subject?: string,
  ) {
    super(`${machine}${subject ? ` ${subject}` : ''}: illegal transition: event "${event}" is not allowed in state "${from}"`);
  }
}

/** For each state, the events it allows and the state each leads to. A pair that is not listed is illegal. */
export type Transitions<S extends string, E extends string> = { readonly [state in S]: Partial<Readonly<Record<E, S>>> };

/** A state machine: its name (used in errors), its states, its events and its table. */
export interface Machine<S extends string, E extends string> {
  readonly name: string;
  readonly states: readonly S[];
  readonly events: readonly E[];
  readonly table: Transitions<S, E>;
}

/**
 * The owner of a state (a data-plane process for a file, a manager for a backup) reported it; the record that
 * mirrors it takes the reported state, which must be one of the machine's states. The owner is the authority: a
 * report may skip states the mirror never saw (polling), so any state of the machine may be reported.
 */
export interface Reported {
  readonly reported: string;
}

/**
 * Returns the state `event` leads to from `from`, or throws {@link IllegalTransitionError}. `subject` names the
 * object in the error (e.g. `backing image manager bim-1`).
 */
export function transition<S extends string, E extends string>(machine: Machine<S, E>, from: S, event: E | Reported, subject?: string): S {
  if (typeof event === 'object') {
    const to = machine.states.find((s) => s === event.reported);
    if (to === undefined) throw new IllegalTransitionError(machine.name, from, `reported "${event.reported}"`, subject);
    return to;
  }
  const to = machine.table[from]?.[event];
  if (to === undefined) throw new IllegalTransitionError(machine.name, from, event, subject);
  return to;
}

/** Whether `event` is allowed in state `from`. */
export function canTransition<S extends string, E extends string>(machine: Machine<S, E>, from: S, event: E): boolean {
  return machine.table[from]?.[event] !== undefined;
}

export interface TransitionRecord<S extends string, E extends string> {
  from: S;
  event: E;
  to: S;
}

/**
 * Holds a current state and applies events through {@link transition}; tells listeners (synchronously, after the
 * state changed).
 */
export class StateMachine<S extends string, E extends string> {
  #state: S;
  #listeners = new Set<(t: TransitionRecord<S, E>) => void>();

  constructor(
    readonly machine: Machine<S, E>,
    initial: S,
  ) {
    this.#state = initial;
  }

  get state(): S {
    return this.#state;
  }

  can(event: E): boolean {
    return canTransition(this.machine, this.#state, event);
  }

  /** Applies the event; throws {@link IllegalTransitionError} when it is not allowed. */
  fire(event: E): S {
    const from = this.#state;
    const to = transition(this.machine, from, event);
    this.#state = to;
    for (const l of this.#listeners) l({ from, event, to });
    return to;
  }

  onTransition(listener: (t: TransitionRecord<S, E>) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }
}
