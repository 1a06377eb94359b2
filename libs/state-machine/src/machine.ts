/** Raised when an event is not allowed in the current state. */
export class IllegalTransitionError<S extends string = string, E extends string = string> extends Error {
  override readonly name = 'IllegalTransitionError';
  constructor(
    readonly machine: string,
    readonly from: S,
    readonly event: E,
  ) {
    super(`${machine}: illegal transition: event "${event}" is not allowed in state "${from}"`);
  }
}

export type Transitions<S extends string, E extends string> = { readonly [state in S]: Partial<Readonly<Record<E, S>>> };

/** Pure transition function over a table: returns the next state or throws {@link IllegalTransitionError}. */
export function nextState<S extends string, E extends string>(
  machine: string,
  table: Transitions<S, E>,
  from: S,
  event: E,
): S {
  const row = table[from];
  if (row === undefined) {
    throw new IllegalTransitionError(machine, from, event);
  }
  const to = row[event];
  if (to === undefined) {
    throw new IllegalTransitionError(machine, from, event);
  }
  return to;
}

export function canTransition<S extends string, E extends string>(table: Transitions<S, E>, from: S, event: E): boolean {
  return table[from]?.[event] !== undefined;
}

export interface TransitionRecord<S extends string, E extends string> {
  from: S;
  event: E;
  to: S;
  at: Date;
}

/**
 * A small stateful wrapper: holds the current state, applies events through the table and tells listeners.
 * Listeners run synchronously after the state has changed.
 */
export class StateMachine<S extends string, E extends string> {
  #state: S;
  #listeners = new Set<(t: TransitionRecord<S, E>) => void>();

  constructor(
    readonly machine: string,
    readonly table: Transitions<S, E>,
    initial: S,
  ) {
    this.#state = initial;
  }

  get state(): S {
    return this.#state;
  }

  can(event: E): boolean {
    return canTransition(this.table, this.#state, event);
  }

  /** Applies the event; throws {@link IllegalTransitionError} when it is not allowed. */
  fire(event: E): S {
    const from = this.#state;
    const to = nextState(this.machine, this.table, from, event);
    this.#state = to;
    const record: TransitionRecord<S, E> = { from, event, to, at: new Date() };
    for (const l of this.#listeners) l(record);
    return to;
  }

  /** Applies the event only when it is allowed; returns whether it was applied. */
  tryFire(event: E): boolean {
    if (!this.can(event)) return false;
    this.fire(event);
    return true;
  }

  onTransition(listener: (t: TransitionRecord<S, E>) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }
}
