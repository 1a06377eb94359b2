"""Shared set-up of the scenarios: Longhorn's own Python client, built exactly as longhorn-tests build it, and the
helpers of longhorn-tests' common.py that the scenarios use (same REST calls, same polling).

Environment:
  LONGHORN_CLIENT_PY  path of longhorn.py (longhorn-tests manager/integration/tests/longhorn.py, unmodified)
  BIS_API             http://host:port of the REST API
  BIS_IMAGE_URL       a raw image the system may download
  BIS_IMAGE_SHA512    its SHA-512
  BIS_IMAGE_FILE      the same image as a local file (for the upload)
"""
import importlib.util
import os
import sys
import time

RETRY_COUNTS = 150
RETRY_INTERVAL = 0.5


def load_longhorn():
    path = os.environ["LONGHORN_CLIENT_PY"]
    spec = importlib.util.spec_from_file_location("longhorn", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["longhorn"] = module
    spec.loader.exec_module(module)
    return module


longhorn = load_longhorn()
API = os.environ["BIS_API"]
IMAGE_URL = os.environ["BIS_IMAGE_URL"]
IMAGE_SHA512 = os.environ["BIS_IMAGE_SHA512"]
IMAGE_FILE = os.environ.get("BIS_IMAGE_FILE", "")


def get_client():
    # common.get_longhorn_api_client: longhorn.from_env(url=<api>/v1/schemas), nothing else.
    return longhorn.from_env(url=API + "/v1/schemas")


def log(*args):
    print(*args, flush=True)


def wait_for(what, fn, counts=RETRY_COUNTS, interval=RETRY_INTERVAL):
    last = None
    for _ in range(counts):
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError("timed out waiting for %s (last value %r)" % (what, last))


def expect_api_error(fn, *fragments):
    """Runs fn, which must raise longhorn.ApiError whose message contains every fragment; returns the error."""
    try:
        fn()
    except longhorn.ApiError as e:
        message = e.error.message
        for f in fragments:
            assert f in message, "expected %r in the error message %r" % (f, message)
        return e
    raise AssertionError("expected an ApiError containing %r" % (fragments,))


def states(bi):
    return [s.state for s in bi.diskFileStatusMap.__dict__.values()]


def disk_map(bi):
    return bi.diskFileStatusMap.__dict__


def create_backing_image_with_matching_url(client, name, url, checksum, min_copies=1):
    """common.create_backing_image_with_matching_url: list, create, then poll by_id until ready."""
    client.list_backing_image()
    client.create_backing_image(name=name, sourceType="download", parameters={"url": url},
                                expectedChecksum=checksum, minNumberOfCopies=min_copies,
                                nodeSelector=[], diskSelector=[], dataEngine="v1")

    def ready():
        bi = client.by_id_backing_image(name)
        if bi is None or bi.deletionTimestamp != "":
            return None
        if len(disk_map(bi)) == min_copies and bi.currentChecksum != "" and "ready" in states(bi):
            return bi
        return None
    return wait_for("backing image %s ready" % name, ready)


def wait_for_backing_image_ready_copies(client, name, count):
    def ready():
        bi = client.by_id_backing_image(name)
        return bi if bi is not None and states(bi).count("ready") == count else None
    return wait_for("%d ready copies of %s" % (count, name), ready)


def wait_for_backing_image_delete(client, name):
    wait_for("backing image %s deleted" % name,
             lambda: all(bi.name != name for bi in client.list_backing_image()))


def wait_for_backing_image_disk_cleanup(client, name, disk):
    wait_for("disk %s removed from %s" % (disk, name),
             lambda: disk not in disk_map(client.by_id_backing_image(name)))


def cleanup_all_backing_images(client):
    for bi in client.list_backing_image():
        try:
            client.delete(bi)
        except longhorn.ApiError as e:
            log("delete %s: %s" % (bi.name, e.error.message))
    wait_for("no backing image", lambda: len(client.list_backing_image()) == 0)


def update_setting(client, name, value):
    setting = client.by_id_setting(name)
    return client.update(setting, value=value)


def run(main):
    client = get_client()
    main(client)
    log("ok")
