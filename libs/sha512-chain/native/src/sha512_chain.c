/*
 * sha512_chain: SHA-512 compression over whole 128-byte blocks starting from an explicit chaining state, and the
 * final padding step, using the OpenSSL SHA-512 that the node binary itself exports (its assembly implementation).
 *
 * A state is 64 bytes: h0..h7, each big-endian. The compression of whole blocks does not depend on the running
 * length, so states carry no length; only finalize() takes the total length.
 *
 *   advance(state, data)              -> Buffer(64)            data.byteLength % 128 == 0, on the calling thread
 *   advanceAsync(state, data)         -> Promise<Buffer(64)>   same, on the libuv thread pool (data is referenced
 *                                                              until the work is done)
 *   advanceZeros(state, length)       -> Buffer(64)            length % 128 == 0 zero bytes, no length-sized buffer
 *   advanceZerosAsync(state, length)  -> Promise<Buffer(64)>
 *   finalize(state, totalLength, tail)-> Buffer(64)            the SHA-512 digest; tail.byteLength == totalLength % 128
 *   advanceMany(states, data, length[, lanes]) -> Buffer(64 * n)        n independent advances of `length` bytes each: states is
 *                                                              n states back to back, data an array of n Uint8Arrays
 *                                                              of `length` bytes or nulls (zeros); on the calling thread.
 *                                                              lanes: 8 = the AVX-512 eight-lane path, 4 = the AVX2
 *                                                              four-lane path (a RangeError where the path is not
 *                                                              supported), 1 = OpenSSL per message; default: the
 *                                                              widest supported
 *   advanceManyAsync(states, data, length) -> Promise<Buffer(64 * n)>   same, on a thread of its own at a lower
 *                                                              priority (nice +5, BIS_SHA512_CHAIN_NICE): verification
 *                                                              is background work that yields to I/O and request
 *                                                              handling; the libuv pool if no thread can be started
 *   multiBufferLanes                  -> number                8 when this build and CPU can compress 8 messages at
 *                                                              once with AVX-512 (sha512_x8.h), else 4 with AVX2
 *                                                              (sha512_x4.h), else 1
 *   supportedLanes                    -> number[]              every `lanes` value this build and CPU accept
 *
 * Which path a caller takes is chosen in TypeScript (BIS_SHA512_CHAIN_IMPL, src/native.ts), passed as `lanes`.
 * BIS_SHA512_CHAIN_NICE=<0..19> sets the nice value of advanceManyAsync's threads (default 5; 0 = unchanged).
 * Argument errors throw TypeError / RangeError with a message naming the argument.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/resource.h>
#include <node_api.h>
#include <openssl/sha.h>
#include "sha512_x8.h"
#include "sha512_x4.h"

#define STATE_BYTES 64
#define BLOCK_BYTES 128
#define ZERO_CHUNK (64 * 1024)
#define MAX_SAFE_INTEGER 9007199254740991.0

static const unsigned char zero_chunk[ZERO_CHUNK];

/* advanceMany uses a multi-lane path for groups of at least this many messages (two zero messages already run faster). */
#define MULTI_MIN_LANES 2
#define MAX_MANY 4096
static int x8_supported = 0;
static int x4_supported = 0;

static void import_state(SHA512_CTX *ctx, const unsigned char *state) {
  SHA512_Init(ctx);
  for (int i = 0; i < 8; i++) {
    uint64_t v = 0;
    for (int j = 0; j < 8; j++) v = (v << 8) | state[i * 8 + j];
    ctx->h[i] = v;
  }
  ctx->Nl = 0;
  ctx->Nh = 0;
  ctx->num = 0;
}

static void export_state(const SHA512_CTX *ctx, unsigned char *state) {
  for (int i = 0; i < 8; i++) {
    uint64_t v = ctx->h[i];
    for (int j = 7; j >= 0; j--) {
      state[i * 8 + j] = (unsigned char)(v & 0xff);
      v >>= 8;
    }
  }
}

static void advance_blocks(unsigned char *state, const unsigned char *data, size_t length) {
  SHA512_CTX ctx;
  import_state(&ctx, state);
  if (length > 0) SHA512_Update(&ctx, data, length);
  export_state(&ctx, state);
}

static void advance_zero_blocks(unsigned char *state, uint64_t length) {
  SHA512_CTX ctx;
  import_state(&ctx, state);
  while (length > 0) {
    size_t n = length > ZERO_CHUNK ? ZERO_CHUNK : (size_t)length;
    SHA512_Update(&ctx, zero_chunk, n);
    length -= n;
  }
  export_state(&ctx, state);
}

/* Reads a Uint8Array (or Buffer) argument: pointer and byte length. Throws a TypeError naming `what` otherwise. */
static int get_bytes(napi_env env, napi_value value, const char *what, unsigned char **data, size_t *length) {
  bool is_typed = false;
  napi_is_typedarray(env, value, &is_typed);
  if (!is_typed) {
    napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", what);
    return 0;
  }
  napi_typedarray_type type;
  size_t count;
  void *ptr;
  if (napi_get_typedarray_info(env, value, &type, &count, &ptr, NULL, NULL) != napi_ok ||
      (type != napi_uint8_array && type != napi_uint8_clamped_array)) {
    napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", what);
    return 0;
  }
  *data = ptr;
  *length = count;
  return 1;
}

static int get_state(napi_env env, napi_value value, unsigned char *state) {
  unsigned char *data;
  size_t length;
  if (!get_bytes(env, value, "state must be a Uint8Array of 64 bytes", &data, &length)) return 0;
  if (length != STATE_BYTES) {
    napi_throw_range_error(env, "ERR_OUT_OF_RANGE", "state must be exactly 64 bytes (h0..h7 big-endian)");
    return 0;
  }
  memcpy(state, data, STATE_BYTES);
  return 1;
}

static int get_length(napi_env env, napi_value value, const char *what, uint64_t *out) {
  napi_valuetype type;
  napi_typeof(env, value, &type);
  if (type != napi_number) {
    napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", what);
    return 0;
  }
  double d;
  napi_get_value_double(env, value, &d);
  if (!(d >= 0) || d > MAX_SAFE_INTEGER || d != (double)(uint64_t)d) {
    napi_throw_range_error(env, "ERR_OUT_OF_RANGE", what);
    return 0;
  }
  *out = (uint64_t)d;
  return 1;
}

static napi_value state_buffer(napi_env env, const unsigned char *state) {
  napi_value result;
  void *copy;
  napi_create_buffer_copy(env, STATE_BYTES, state, &copy, &result);
  return result;
}

/*
 * The two arguments (state, second) of the advance functions: throws a TypeError with `usage` when there are fewer,
 * reads the state, and hands back the second argument. Returns 0 after throwing.
 */
static int parse_state_and(napi_env env, napi_callback_info info, const char *usage, unsigned char *state,
                           napi_value *second) {
  size_t argc = 2;
  napi_value argv[2];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  if (argc < 2) {
    napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", usage);
    return 0;
  }
  if (!get_state(env, argv[0], state)) return 0;
  *second = argv[1];
  return 1;
}

/* Arguments (state, data) of advance and advanceAsync; data.length must be a multiple of 128. */
static int parse_data_args(napi_env env, napi_callback_info info, const char *usage, unsigned char *state,
                           unsigned char **data, size_t *length, napi_value *data_value) {
  napi_value value;
  if (!parse_state_and(env, info, usage, state, &value)) return 0;
  if (!get_bytes(env, value, "data must be a Uint8Array", data, length)) return 0;
  if (*length % BLOCK_BYTES != 0) {
    napi_throw_range_error(env, "ERR_OUT_OF_RANGE", "data length must be a multiple of 128 bytes");
    return 0;
  }
  if (data_value != NULL) *data_value = value;
  return 1;
}

/* Arguments (state, length) of advanceZeros and advanceZerosAsync; length must be a multiple of 128. */
static int parse_zeros_args(napi_env env, napi_callback_info info, const char *usage, unsigned char *state,
                            uint64_t *length) {
  napi_value value;
  if (!parse_state_and(env, info, usage, state, &value)) return 0;
  if (!get_length(env, value, "length must be a non-negative safe integer", length)) return 0;
  if (*length % BLOCK_BYTES != 0) {
    napi_throw_range_error(env, "ERR_OUT_OF_RANGE", "length must be a multiple of 128 bytes");
    return 0;
  }
  return 1;
}

/* ---- synchronous ---- */

static napi_value advance_sync(napi_env env, napi_callback_info info) {
  unsigned char state[STATE_BYTES];
  unsigned char *data;
  size_t length;
  if (!parse_data_args(env, info, "advance(state, data) needs two arguments", state, &data, &length, NULL)) return NULL;
  advance_blocks(state, data, length);
  return state_buffer(env, state);
}

static napi_value advance_zeros_sync(napi_env env, napi_callback_info info) {
  unsigned char state[STATE_BYTES];
  uint64_t length;
  if (!parse_zeros_args(env, info, "advanceZeros(state, length) needs two arguments", state, &length)) return NULL;
  advance_zero_blocks(state, length);
  return state_buffer(env, state);
}

static napi_value finalize(napi_env env, napi_callback_info info) {
  size_t argc = 3;
  napi_value argv[3];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  if (argc < 3) {
    napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", "finalize(state, totalLength, tail) needs three arguments");
    return NULL;
  }
  unsigned char state[STATE_BYTES];
  uint64_t total;
  unsigned char *tail;
  size_t tail_length;
  if (!get_state(env, argv[0], state)) return NULL;
  if (!get_length(env, argv[1], "totalLength must be a non-negative safe integer", &total)) return NULL;
  if (!get_bytes(env, argv[2], "tail must be a Uint8Array", &tail, &tail_length)) return NULL;
  if (tail_length != total % BLOCK_BYTES) {
    napi_throw_range_error(env, "ERR_OUT_OF_RANGE", "tail length must be totalLength % 128");
    return NULL;
  }
  SHA512_CTX ctx;
  import_state(&ctx, state);
  /* Bit count of the whole blocks already compressed into the state; total < 2^53, so it fits in Nl. */
  ctx.Nl = (SHA_LONG64)((total - tail_length) << 3);
  ctx.Nh = 0;
  if (tail_length > 0) SHA512_Update(&ctx, tail, tail_length);
  unsigned char digest[SHA512_DIGEST_LENGTH];
  SHA512_Final(digest, &ctx);
  return state_buffer(env, digest);
}

/* ---- on the libuv thread pool ---- */

typedef struct {
  napi_async_work work;
  napi_deferred deferred;
  napi_ref data_ref; /* keeps the input alive until complete; NULL for zeros */
  const unsigned char *data;
  uint64_t length;
  unsigned char state[STATE_BYTES];
} advance_request;

static void advance_execute(napi_env env, void *raw) {
  (void)env;
  advance_request *req = raw;
  if (req->data != NULL) advance_blocks(req->state, req->data, (size_t)req->length);
  else advance_zero_blocks(req->state, req->length);
}

/* Settles `deferred` with `value`, or rejects it naming `what` when the work was cancelled (status not ok). */
static void settle(napi_env env, napi_deferred deferred, napi_status status, const char *what, napi_value value) {
  if (status == napi_ok) {
    napi_resolve_deferred(env, deferred, value);
    return;
  }
  napi_value message, error;
  napi_create_string_utf8(env, what, NAPI_AUTO_LENGTH, &message);
  napi_create_error(env, NULL, message, &error);
  napi_reject_deferred(env, deferred, error);
}

static void advance_complete(napi_env env, napi_status status, void *raw) {
  advance_request *req = raw;
  settle(env, req->deferred, status, "SHA-512 chain advance was cancelled",
         status == napi_ok ? state_buffer(env, req->state) : NULL);
  if (req->data_ref != NULL) napi_delete_reference(env, req->data_ref);
  napi_delete_async_work(env, req->work);
  free(req);
}

/* Queues `execute` on the thread pool (then `complete` on the JS thread) and returns the promise it settles. */
static napi_value queue_work(napi_env env, const char *name, napi_async_execute_callback execute,
                             napi_async_complete_callback complete, void *data, napi_deferred *deferred,
                             napi_async_work *work) {
  napi_value promise, resource_name;
  napi_create_promise(env, deferred, &promise);
  napi_create_string_utf8(env, name, NAPI_AUTO_LENGTH, &resource_name);
  napi_create_async_work(env, NULL, resource_name, execute, complete, data, work);
  napi_queue_async_work(env, *work);
  return promise;
}

/*
 * Queues an advance of `length` bytes from `state`: of `data` (referenced by `data_value` until done), or of zeros
 * when `data_value` is NULL. `what` names the function in the out-of-memory error.
 */
static napi_value queue_advance(napi_env env, const unsigned char *state, const unsigned char *data, napi_value data_value,
                                uint64_t length, const char *name, const char *what) {
  advance_request *req = calloc(1, sizeof *req);
  if (req == NULL) {
    napi_throw_error(env, "ENOMEM", what);
    return NULL;
  }
  memcpy(req->state, state, STATE_BYTES);
  req->length = length;
  /* An empty view may have a NULL pointer; the zero path with length 0 is the same no-op. */
  if (data_value != NULL && length > 0) {
    req->data = data;
    napi_create_reference(env, data_value, 1, &req->data_ref);
  }
  return queue_work(env, name, advance_execute, advance_complete, req, &req->deferred, &req->work);
}

static napi_value advance_async(napi_env env, napi_callback_info info) {
  unsigned char state[STATE_BYTES];
  unsigned char *data;
  size_t length;
  napi_value data_value;
  if (!parse_data_args(env, info, "advanceAsync(state, data) needs two arguments", state, &data, &length, &data_value)) return NULL;
  return queue_advance(env, state, data, data_value, length, "bis.sha512_chain.advance", "advanceAsync: out of memory");
}

static napi_value advance_zeros_async(napi_env env, napi_callback_info info) {
  unsigned char state[STATE_BYTES];
  uint64_t length;
  if (!parse_zeros_args(env, info, "advanceZerosAsync(state, length) needs two arguments", state, &length)) return NULL;
  return queue_advance(env, state, NULL, NULL, length, "bis.sha512_chain.advanceZeros", "advanceZerosAsync: out of memory");
}

/* ---- many independent messages of one length (sha512_x8 when available) ---- */

static uint64_t load_be64(const unsigned char *p) {
  uint64_t v = 0;
  for (int j = 0; j < 8; j++) v = (v << 8) | p[j];
  return v;
}

static void store_be64(unsigned char *p, uint64_t v) {
  for (int j = 7; j >= 0; j--) {
    p[j] = (unsigned char)(v & 0xff);
    v >>= 8;
  }
}

/* lanes: 8 (sha512_x8), 4 (sha512_x4) or 1 (OpenSSL per message); the caller checked that the path is supported. */
static void advance_many_run(unsigned char *states, const unsigned char *const *data, size_t count, uint64_t length, int lanes) {
  size_t i = 0;
  if (lanes > 1 && length > 0) {
    while (count - i >= MULTI_MIN_LANES) {
      size_t n = count - i < (size_t)lanes ? count - i : (size_t)lanes;
      uint64_t st[SHA512_X8_LANES][8];
      const uint8_t *dp[SHA512_X8_LANES];
      for (size_t l = 0; l < (size_t)lanes; l++) {
        for (int k = 0; k < 8; k++) st[l][k] = l < n ? load_be64(states + (i + l) * STATE_BYTES + k * 8) : 0;
        dp[l] = l < n ? data[i + l] : NULL;
      }
      if (lanes == SHA512_X8_LANES) sha512_x8(st, dp, (size_t)(length / BLOCK_BYTES));
      else sha512_x4(st, dp, (size_t)(length / BLOCK_BYTES));
      for (size_t l = 0; l < n; l++) {
        for (int k = 0; k < 8; k++) store_be64(states + (i + l) * STATE_BYTES + k * 8, st[l][k]);
      }
      i += n;
    }
  }
  for (; i < count; i++) {
    if (data[i] != NULL) advance_blocks(states + i * STATE_BYTES, data[i], (size_t)length);
    else advance_zero_blocks(states + i * STATE_BYTES, length);
  }
}

typedef struct {
  napi_async_work work;
  napi_threadsafe_function tsfn;
  napi_deferred deferred;
  size_t count;
  uint64_t length;
  int lanes;                   /* 8: AVX-512 eight-lane path, 4: AVX2 four-lane path, 1: OpenSSL */
  unsigned char *states;       /* count * 64, advanced in place */
  const unsigned char **data;  /* count pointers, NULL = zeros */
  napi_ref *refs;              /* count references keeping the data alive (NULL for zeros) */
} many_request;

static void many_free(napi_env env, many_request *req) {
  if (req->refs != NULL && env != NULL) {
    for (size_t i = 0; i < req->count; i++) {
      if (req->refs[i] != NULL) napi_delete_reference(env, req->refs[i]);
    }
  }
  free(req->refs);
  free(req->data);
  free(req->states);
  free(req);
}

/*
 * Arguments (states, data, length) of advanceMany and advanceManyAsync. With `keep`, every data view gets a reference
 * so that it outlives the call. Returns NULL after throwing.
 */
static many_request *parse_many_args(napi_env env, napi_callback_info info, const char *usage, int keep) {
  size_t argc = 4;
  napi_value argv[4];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  if (argc < 3) {
    napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", usage);
    return NULL;
  }
  bool is_array = false;
  napi_is_array(env, argv[1], &is_array);
  if (!is_array) {
    napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", "data must be an array of Uint8Arrays or nulls");
    return NULL;
  }
  uint32_t count;
  napi_get_array_length(env, argv[1], &count);
  if (count < 1 || count > MAX_MANY) {
    napi_throw_range_error(env, "ERR_OUT_OF_RANGE", "data must hold between 1 and 4096 messages");
    return NULL;
  }
  unsigned char *states_in;
  size_t states_length;
  if (!get_bytes(env, argv[0], "states must be a Uint8Array of 64 bytes per message", &states_in, &states_length)) return NULL;
  if (states_length != (size_t)count * STATE_BYTES) {
    napi_throw_range_error(env, "ERR_OUT_OF_RANGE", "states must be exactly 64 bytes per message (data.length * 64)");
    return NULL;
  }
  uint64_t length;
  if (!get_length(env, argv[2], "length must be a non-negative safe integer", &length)) return NULL;
  if (length % BLOCK_BYTES != 0) {
    napi_throw_range_error(env, "ERR_OUT_OF_RANGE", "length must be a multiple of 128 bytes");
    return NULL;
  }
  int use_lanes = x8_supported ? SHA512_X8_LANES : x4_supported ? SHA512_X4_LANES : 1;
  napi_valuetype lanes_type = napi_undefined;
  if (argc >= 4) napi_typeof(env, argv[3], &lanes_type);
  if (lanes_type != napi_undefined) {
    uint32_t lanes = 0;
    if (lanes_type != napi_number || napi_get_value_uint32(env, argv[3], &lanes) != napi_ok ||
        (lanes != 1 && lanes != SHA512_X4_LANES && lanes != SHA512_X8_LANES)) {
      napi_throw_range_error(env, "ERR_OUT_OF_RANGE", "lanes must be 1 (OpenSSL per message), 4 (AVX2) or 8 (AVX-512)");
      return NULL;
    }
    if (lanes == SHA512_X8_LANES && !x8_supported) {
      napi_throw_range_error(env, "ERR_OUT_OF_RANGE", "lanes 8 needs AVX-512F and AVX-512BW, which this CPU or build does not have");
      return NULL;
    }
    if (lanes == SHA512_X4_LANES && !x4_supported) {
      napi_throw_range_error(env, "ERR_OUT_OF_RANGE", "lanes 4 needs AVX2, which this CPU or build does not have");
      return NULL;
    }
    use_lanes = (int)lanes;
  }
  many_request *req = calloc(1, sizeof *req);
  if (req != NULL) {
    req->lanes = use_lanes;
    req->count = count;
    req->length = length;
    req->states = malloc((size_t)count * STATE_BYTES);
    req->data = calloc(count, sizeof *req->data);
    req->refs = keep ? calloc(count, sizeof *req->refs) : NULL;
  }
  if (req == NULL || req->states == NULL || req->data == NULL || (keep && req->refs == NULL)) {
    if (req != NULL) many_free(env, req);
    napi_throw_error(env, "ENOMEM", "advanceMany: out of memory");
    return NULL;
  }
  memcpy(req->states, states_in, (size_t)count * STATE_BYTES);
  for (uint32_t i = 0; i < count; i++) {
    napi_value item;
    napi_valuetype type;
    napi_get_element(env, argv[1], i, &item);
    napi_typeof(env, item, &type);
    if (type == napi_null) continue;
    unsigned char *bytes;
    size_t bytes_length;
    if (!get_bytes(env, item, "every data item must be a Uint8Array or null", &bytes, &bytes_length)) {
      many_free(env, req);
      return NULL;
    }
    if (bytes_length != length) {
      napi_throw_range_error(env, "ERR_OUT_OF_RANGE", "every data item must be exactly `length` bytes");
      many_free(env, req);
      return NULL;
    }
    /* length 0: nothing is read, NULL and an empty view are the same */
    if (length == 0) continue;
    req->data[i] = bytes;
    if (keep) napi_create_reference(env, item, 1, &req->refs[i]);
  }
  return req;
}

static napi_value advance_many_sync(napi_env env, napi_callback_info info) {
  many_request *req = parse_many_args(env, info, "advanceMany(states, data, length) needs three arguments", 0);
  if (req == NULL) return NULL;
  advance_many_run(req->states, req->data, req->count, req->length, req->lanes);
  napi_value result;
  void *copy;
  napi_create_buffer_copy(env, req->count * STATE_BYTES, req->states, &copy, &result);
  many_free(env, req);
  return result;
}

static void many_execute(napi_env env, void *raw) {
  (void)env;
  many_request *req = raw;
  advance_many_run(req->states, req->data, req->count, req->length, req->lanes);
}

/* Settles an advanceManyAsync promise: the advanced states, or the cancellation. */
static void many_deliver(napi_env env, many_request *req, napi_status status) {
  napi_value result = NULL;
  if (status == napi_ok) {
    void *copy;
    napi_create_buffer_copy(env, req->count * STATE_BYTES, req->states, &copy, &result);
  }
  settle(env, req->deferred, status, "SHA-512 chain advanceMany was cancelled", result);
}

static void many_complete(napi_env env, napi_status status, void *raw) {
  many_request *req = raw;
  many_deliver(env, req, status);
  napi_delete_async_work(env, req->work);
  many_free(env, req);
}

/* Nice value of the threads of advanceManyAsync (0: the caller's priority). */
static int many_nice = 5;

static void many_settle(napi_env env, napi_value js_cb, void *context, void *raw) {
  (void)js_cb;
  (void)context;
  many_request *req = raw;
  if (env != NULL) many_deliver(env, req, napi_ok);
  napi_release_threadsafe_function(req->tsfn, napi_tsfn_release);
  many_free(env, req);
}

static void *many_thread(void *raw) {
  many_request *req = raw;
  /* per thread on Linux: only this thread runs at the lower priority */
  if (many_nice > 0) setpriority(PRIO_PROCESS, 0, many_nice);
  advance_many_run(req->states, req->data, req->count, req->length, req->lanes);
  napi_call_threadsafe_function(req->tsfn, req, napi_tsfn_blocking);
  return NULL;
}

static napi_value advance_many_async(napi_env env, napi_callback_info info) {
  many_request *req = parse_many_args(env, info, "advanceManyAsync(states, data, length) needs three arguments", 1);
  if (req == NULL) return NULL;
  /*
   * A thread of its own per call (the scheduler above keeps a few calls in flight; a call compresses megabytes), at a
   * lower priority: a verification that waits a little costs nothing, a socket read or a device write that waits for
   * a core holds the transfer back. Measured on a 2-core Sync of 1 GiB of data: 0.98-1.06 s against 1.02-1.16 s with
   * the hashing at the same priority as the I/O.
   */
  napi_value name;
  napi_create_string_utf8(env, "bis.sha512_chain.advanceMany", NAPI_AUTO_LENGTH, &name);
  if (napi_create_threadsafe_function(env, NULL, NULL, name, 0, 1, NULL, NULL, NULL, many_settle, &req->tsfn) == napi_ok) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    pthread_t thread;
    int err = pthread_create(&thread, &attr, many_thread, req);
    pthread_attr_destroy(&attr);
    if (err == 0) {
      /* the result is settled on this (the JS) thread, after this function returned: the deferred exists by then */
      napi_value promise;
      napi_create_promise(env, &req->deferred, &promise);
      return promise;
    }
    /* no thread: the thread pool does it */
    napi_release_threadsafe_function(req->tsfn, napi_tsfn_release);
    req->tsfn = NULL;
  }
  return queue_work(env, "bis.sha512_chain.advanceMany", many_execute, many_complete, req, &req->deferred, &req->work);
}

static napi_value init(napi_env env, napi_value exports) {
  x8_supported = sha512_x8_supported();
  x4_supported = sha512_x4_supported();
  const char *nice_env = getenv("BIS_SHA512_CHAIN_NICE");
  if (nice_env != NULL && *nice_env != '\0') {
    char *end;
    long v = strtol(nice_env, &end, 10);
    if (*end == '\0' && v >= 0 && v <= 19) many_nice = (int)v;
  }
  napi_value lanes;
  napi_create_uint32(env, x8_supported ? SHA512_X8_LANES : x4_supported ? SHA512_X4_LANES : 1, &lanes);
  napi_value supported;
  napi_create_array(env, &supported);
  uint32_t n_supported = 0;
  const int all_lanes[] = {1, SHA512_X4_LANES, SHA512_X8_LANES};
  for (size_t k = 0; k < sizeof all_lanes / sizeof all_lanes[0]; k++) {
    int ok = all_lanes[k] == 1 || (all_lanes[k] == SHA512_X4_LANES && x4_supported) || (all_lanes[k] == SHA512_X8_LANES && x8_supported);
    if (!ok) continue;
    napi_value v;
    napi_create_uint32(env, (uint32_t)all_lanes[k], &v);
    napi_set_element(env, supported, n_supported++, v);
  }
  napi_property_descriptor props[] = {
    {"advance", NULL, advance_sync, NULL, NULL, NULL, napi_enumerable, NULL},
    {"advanceAsync", NULL, advance_async, NULL, NULL, NULL, napi_enumerable, NULL},
    {"advanceZeros", NULL, advance_zeros_sync, NULL, NULL, NULL, napi_enumerable, NULL},
    {"advanceZerosAsync", NULL, advance_zeros_async, NULL, NULL, NULL, napi_enumerable, NULL},
    {"finalize", NULL, finalize, NULL, NULL, NULL, napi_enumerable, NULL},
    {"advanceMany", NULL, advance_many_sync, NULL, NULL, NULL, napi_enumerable, NULL},
    {"advanceManyAsync", NULL, advance_many_async, NULL, NULL, NULL, napi_enumerable, NULL},
    {"multiBufferLanes", NULL, NULL, NULL, NULL, lanes, napi_enumerable, NULL},
    {"supportedLanes", NULL, NULL, NULL, NULL, supported, napi_enumerable, NULL},
  };
  napi_define_properties(env, exports, sizeof props / sizeof props[0], props);
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, init)
