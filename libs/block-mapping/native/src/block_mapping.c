/*
 * block_mapping: the three file-layout system calls Node's standard library lacks.
 *
 *   seekData(fd, offset)       lseek(fd, offset, SEEK_DATA); -1 when there is no data at or after offset (ENXIO)
 *   seekHole(fd, offset)       lseek(fd, offset, SEEK_HOLE); -1 when offset is at or past the end (ENXIO)
 *   punchHole(fd, offset, len) fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, len)
 *                              run on the libuv thread pool; returns a Promise<void>
 *   startSendFile(socketFd, fileFd, offset, len)
 *                              sends [offset, offset + len) of a file to a (non-blocking) socket with sendfile(2): the
 *                              kernel hands page-cache pages to the socket, no copy through user space. Runs on a thread
 *                              of its own (waiting for the socket with poll(2) must not hold a thread-pool thread) on
 *                              duplicates of both descriptors, so closing the caller's descriptors cannot make it write
 *                              to a reused descriptor number. Returns { id, done: Promise<number of bytes sent> }.
 *   cancelSendFile(id)         shuts the socket down under a running startSendFile (its promise then rejects);
 *                              false when that transfer has already ended (its thread is done, even if the result has
 *                              not reached JavaScript yet)
 *
 * Errors are thrown (or the promise rejected) as Error objects whose `code` is the errno name (e.g. "EOPNOTSUPP")
 * and whose `errno` is the number.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <poll.h>
#include <pthread.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <linux/falloc.h>
#include <node_api.h>

static const char *errno_name(int err) {
  switch (err) {
    case EBADF: return "EBADF";
    case EINVAL: return "EINVAL";
    case ENXIO: return "ENXIO";
    case EOVERFLOW: return "EOVERFLOW";
    case ESPIPE: return "ESPIPE";
    case EOPNOTSUPP: return "EOPNOTSUPP";
    case EFBIG: return "EFBIG";
    case EINTR: return "EINTR";
    case EIO: return "EIO";
    case ENODEV: return "ENODEV";
    case ENOSPC: return "ENOSPC";
    case EPERM: return "EPERM";
    case ETXTBSY: return "ETXTBSY";
    case EISDIR: return "EISDIR";
    case EROFS: return "EROFS";
    case EACCES: return "EACCES";
    case EPIPE: return "EPIPE";
    case ECONNRESET: return "ECONNRESET";
    case EAGAIN: return "EAGAIN";
    case ENOTSOCK: return "ENOTSOCK";
    case ENOMEM: return "ENOMEM";
    case ENODATA: return "ENODATA";
    default: return "EUNKNOWN";
  }
}

static napi_value make_errno_error(napi_env env, const char *syscall, int err) {
  char msg[256];
  snprintf(msg, sizeof msg, "%s: %s (%s)", syscall, strerror(err), errno_name(err));
  napi_value code, message, error, errno_value;
  napi_create_string_utf8(env, errno_name(err), NAPI_AUTO_LENGTH, &code);
  napi_create_string_utf8(env, msg, NAPI_AUTO_LENGTH, &message);
  napi_create_error(env, code, message, &error);
  napi_create_int32(env, err, &errno_value);
  napi_set_named_property(env, error, "errno", errno_value);
  napi_value syscall_value;
  napi_create_string_utf8(env, syscall, NAPI_AUTO_LENGTH, &syscall_value);
  napi_set_named_property(env, error, "syscall", syscall_value);
  return error;
}

/* Reads argument `index` as a non-negative integer that fits in an int64; throws a TypeError otherwise. */
static int get_int64_arg(napi_env env, napi_value *argv, size_t argc, size_t index, const char *name, int64_t *out) {
  if (index >= argc) {
    napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", name);
    return 0;
  }
  napi_valuetype type;
  napi_typeof(env, argv[index], &type);
  if (type != napi_number) {
    napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", name);
    return 0;
  }
  double d;
  napi_get_value_double(env, argv[index], &d);
  if (!(d >= 0) || d > 9007199254740991.0 || d != (double)(int64_t)d) {
    napi_throw_range_error(env, "ERR_OUT_OF_RANGE", name);
    return 0;
  }
  *out = (int64_t)d;
  return 1;
}

static napi_value do_seek(napi_env env, napi_callback_info info, int whence, const char *syscall) {
  size_t argc = 2;
  napi_value argv[2];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  int64_t fd, offset;
  if (!get_int64_arg(env, argv, argc, 0, "fd must be a non-negative integer", &fd)) return NULL;
  if (!get_int64_arg(env, argv, argc, 1, "offset must be a non-negative safe integer", &offset)) return NULL;
  off_t r = lseek((int)fd, (off_t)offset, whence);
  napi_value result;
  if (r < 0) {
    if (errno == ENXIO) {
      napi_create_int64(env, -1, &result);
      return result;
    }
    napi_throw(env, make_errno_error(env, syscall, errno));
    return NULL;
  }
  napi_create_int64(env, (int64_t)r, &result);
  return result;
}

static napi_value seek_data(napi_env env, napi_callback_info info) {
  return do_seek(env, info, SEEK_DATA, "lseek(SEEK_DATA)");
}

static napi_value seek_hole(napi_env env, napi_callback_info info) {
  return do_seek(env, info, SEEK_HOLE, "lseek(SEEK_HOLE)");
}

typedef struct {
  napi_async_work work;
  napi_deferred deferred;
  int fd;
  int64_t offset;
  int64_t length;
  int err;
} punch_request;

static void punch_execute(napi_env env, void *data) {
  (void)env;
  punch_request *req = data;
  int r;
  do {
    r = fallocate(req->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)req->offset, (off_t)req->length);
  } while (r < 0 && errno == EINTR);
  req->err = r < 0 ? errno : 0;
}

static void punch_complete(napi_env env, napi_status status, void *data) {
  punch_request *req = data;
  if (status != napi_ok) {
    napi_value message, error;
    napi_create_string_utf8(env, "punchHole was cancelled", NAPI_AUTO_LENGTH, &message);
    napi_create_error(env, NULL, message, &error);
    napi_reject_deferred(env, req->deferred, error);
  } else if (req->err != 0) {
    napi_reject_deferred(env, req->deferred, make_errno_error(env, "fallocate(PUNCH_HOLE|KEEP_SIZE)", req->err));
  } else {
    napi_value undefined;
    napi_get_undefined(env, &undefined);
    napi_resolve_deferred(env, req->deferred, undefined);
  }
  napi_delete_async_work(env, req->work);
  free(req);
}

static napi_value punch_hole(napi_env env, napi_callback_info info) {
  size_t argc = 3;
  napi_value argv[3];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  int64_t fd, offset, length;
  if (!get_int64_arg(env, argv, argc, 0, "fd must be a non-negative integer", &fd)) return NULL;
  if (!get_int64_arg(env, argv, argc, 1, "offset must be a non-negative safe integer", &offset)) return NULL;
  if (!get_int64_arg(env, argv, argc, 2, "length must be a non-negative safe integer", &length)) return NULL;
  punch_request *req = calloc(1, sizeof *req);
  if (req == NULL) {
    napi_throw_error(env, "ENOMEM", "punchHole: out of memory");
    return NULL;
  }
  req->fd = (int)fd;
  req->offset = offset;
  req->length = length;
  napi_value promise, name;
  napi_create_promise(env, &req->deferred, &promise);
  napi_create_string_utf8(env, "bis.block_mapping.punchHole", NAPI_AUTO_LENGTH, &name);
  napi_create_async_work(env, NULL, name, punch_execute, punch_complete, req, &req->work);
  napi_queue_async_work(env, req->work);
  return promise;
}

/* ---- startSendFile / cancelSendFile ---- */

typedef struct send_request {
  uint32_t id;
  int sock, file;
  int64_t offset, length, sent;
  int err;            /* errno of the failure; ENODATA: the file ended first */
  pthread_mutex_t lock;
  int finished;       /* the thread is done with the socket (under lock): a cancel no longer shuts it down */
  napi_deferred deferred;
  napi_threadsafe_function tsfn;
  struct send_request *next;
} send_request;

/* Transfers whose promise has not settled yet (touched on the JS thread only). */
static send_request *active_sends = NULL;
static uint32_t next_send_id = 1;

static void *send_thread(void *arg) {
  send_request *req = arg;
  while (req->sent < req->length) {
    off_t off = (off_t)(req->offset + req->sent);
    int64_t left = req->length - req->sent;
    size_t want = left > (1 << 30) ? (size_t)(1 << 30) : (size_t)left;
    ssize_t n = sendfile(req->sock, req->file, &off, want);
    if (n > 0) {
      req->sent += n;
      continue;
    }
    if (n == 0) {
      req->err = ENODATA;
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN) {
      /* the socket buffer is full: wait until it drains (or the socket is shut down / fails: sendfile then says how) */
      struct pollfd p = {req->sock, POLLOUT, 0};
      if (poll(&p, 1, -1) < 0 && errno != EINTR) {
        req->err = errno;
        break;
      }
      continue;
    }
    req->err = errno;
    break;
  }
  pthread_mutex_lock(&req->lock);
  req->finished = 1;
  pthread_mutex_unlock(&req->lock);
  napi_call_threadsafe_function(req->tsfn, req, napi_tsfn_blocking);
  return NULL;
}

static void send_settle(napi_env env, napi_value js_cb, void *context, void *data) {
  (void)js_cb;
  (void)context;
  send_request *req = data;
  for (send_request **p = &active_sends; *p != NULL; p = &(*p)->next) {
    if (*p == req) {
      *p = req->next;
      break;
    }
  }
  close(req->sock);
  close(req->file);
  if (env != NULL) {
    if (req->err == ENODATA) {
      char msg[160];
      snprintf(msg, sizeof msg, "sendfile: the file ended after %lld of %lld bytes", (long long)req->sent, (long long)req->length);
      napi_value code, message, error;
      napi_create_string_utf8(env, "ENODATA", NAPI_AUTO_LENGTH, &code);
      napi_create_string_utf8(env, msg, NAPI_AUTO_LENGTH, &message);
      napi_create_error(env, code, message, &error);
      napi_reject_deferred(env, req->deferred, error);
    } else if (req->err != 0) {
      napi_reject_deferred(env, req->deferred, make_errno_error(env, "sendfile", req->err));
    } else {
      napi_value sent;
      napi_create_double(env, (double)req->sent, &sent);
      napi_resolve_deferred(env, req->deferred, sent);
    }
  }
  napi_release_threadsafe_function(req->tsfn, napi_tsfn_release);
  pthread_mutex_destroy(&req->lock);
  free(req);
}

static napi_value start_send_file(napi_env env, napi_callback_info info) {
  size_t argc = 4;
  napi_value argv[4];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  int64_t sock, file, offset, length;
  if (!get_int64_arg(env, argv, argc, 0, "socketFd must be a non-negative integer", &sock)) return NULL;
  if (!get_int64_arg(env, argv, argc, 1, "fileFd must be a non-negative integer", &file)) return NULL;
  if (!get_int64_arg(env, argv, argc, 2, "offset must be a non-negative safe integer", &offset)) return NULL;
  if (!get_int64_arg(env, argv, argc, 3, "length must be a non-negative safe integer", &length)) return NULL;
  send_request *req = calloc(1, sizeof *req);
  if (req == NULL) {
    napi_throw_error(env, "ENOMEM", "startSendFile: out of memory");
    return NULL;
  }
  req->sock = fcntl((int)sock, F_DUPFD_CLOEXEC, 0);
  if (req->sock < 0) {
    int err = errno;
    free(req);
    napi_throw(env, make_errno_error(env, "dup(socket)", err));
    return NULL;
  }
  req->file = fcntl((int)file, F_DUPFD_CLOEXEC, 0);
  if (req->file < 0) {
    int err = errno;
    close(req->sock);
    free(req);
    napi_throw(env, make_errno_error(env, "dup(file)", err));
    return NULL;
  }
  req->offset = offset;
  req->length = length;
  pthread_mutex_init(&req->lock, NULL);
  napi_value promise, name;
  napi_create_promise(env, &req->deferred, &promise);
  napi_create_string_utf8(env, "bis.block_mapping.sendFile", NAPI_AUTO_LENGTH, &name);
  if (napi_create_threadsafe_function(env, NULL, NULL, name, 0, 1, NULL, NULL, NULL, send_settle, &req->tsfn) != napi_ok) {
    close(req->sock);
    close(req->file);
    pthread_mutex_destroy(&req->lock);
    free(req);
    napi_throw_error(env, NULL, "startSendFile: cannot create a thread-safe function");
    return NULL;
  }
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 64 * 1024);
  pthread_t thread;
  int perr = pthread_create(&thread, &attr, send_thread, req);
  pthread_attr_destroy(&attr);
  if (perr != 0) {
    req->err = perr;
    req->finished = 1;
    /* settles through the same path (rejects with the pthread_create error) */
    napi_call_threadsafe_function(req->tsfn, req, napi_tsfn_blocking);
  }
  req->id = next_send_id++;
  if (next_send_id == 0) next_send_id = 1;
  req->next = active_sends;
  active_sends = req;
  napi_value result, id;
  napi_create_object(env, &result);
  napi_create_uint32(env, req->id, &id);
  napi_set_named_property(env, result, "id", id);
  napi_set_named_property(env, result, "done", promise);
  return result;
}

static napi_value cancel_send_file(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  uint32_t id = 0;
  if (argc < 1 || napi_get_value_uint32(env, argv[0], &id) != napi_ok) {
    napi_throw_type_error(env, NULL, "id must be a transfer id");
    return NULL;
  }
  bool found = false;
  for (send_request *r = active_sends; r != NULL; r = r->next) {
    if (r->id == id) {
      /* a transfer whose thread is done (its result not delivered yet) is over: its connection is left alone */
      pthread_mutex_lock(&r->lock);
      if (!r->finished) {
        shutdown(r->sock, SHUT_RDWR);
        found = true;
      }
      pthread_mutex_unlock(&r->lock);
      break;
    }
  }
  napi_value result;
  napi_get_boolean(env, found, &result);
  return result;
}

static napi_value init(napi_env env, napi_value exports) {
  napi_property_descriptor props[] = {
    {"seekData", NULL, seek_data, NULL, NULL, NULL, napi_enumerable, NULL},
    {"seekHole", NULL, seek_hole, NULL, NULL, NULL, napi_enumerable, NULL},
    {"punchHole", NULL, punch_hole, NULL, NULL, NULL, napi_enumerable, NULL},
    {"startSendFile", NULL, start_send_file, NULL, NULL, NULL, napi_enumerable, NULL},
    {"cancelSendFile", NULL, cancel_send_file, NULL, NULL, NULL, napi_enumerable, NULL},
  };
  napi_define_properties(env, exports, sizeof props / sizeof props[0], props);
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, init)
