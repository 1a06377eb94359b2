/*
 * block_mapping: the three file-layout system calls Node's standard library lacks.
 *
 *   seekData(fd, offset)       lseek(fd, offset, SEEK_DATA); -1 when there is no data at or after offset (ENXIO)
 *   seekHole(fd, offset)       lseek(fd, offset, SEEK_HOLE); -1 when offset is at or past the end (ENXIO)
 *   punchHole(fd, offset, len) fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, len)
 *                              run on the libuv thread pool; returns a Promise<void>
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

static napi_value init(napi_env env, napi_value exports) {
  napi_property_descriptor props[] = {
    {"seekData", NULL, seek_data, NULL, NULL, NULL, napi_enumerable, NULL},
    {"seekHole", NULL, seek_hole, NULL, NULL, NULL, napi_enumerable, NULL},
    {"punchHole", NULL, punch_hole, NULL, NULL, NULL, napi_enumerable, NULL},
  };
  napi_define_properties(env, exports, sizeof props / sizeof props[0], props);
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, init)
