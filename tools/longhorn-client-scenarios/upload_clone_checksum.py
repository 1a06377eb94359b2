"""Upload (Longhorn's UI upload: POST <self>?action=upload&size=N, multipart part "chunk"), clone, and
test_backing_image_with_wrong_md5sum (a wrong expected checksum ends in failed-and-cleanup)."""
import os

import requests

from common import (IMAGE_FILE, IMAGE_SHA512, IMAGE_URL, cleanup_all_backing_images, run, states, wait_for,
                    wait_for_backing_image_ready_copies)


def main(client):
    client.create_backing_image(name="bi-upload", sourceType="upload", parameters={},
                                expectedChecksum=IMAGE_SHA512, minNumberOfCopies=1, dataEngine="v1")
    bi = client.by_id_backing_image("bi-upload")
    size = os.path.getsize(IMAGE_FILE)

    def upload():
        with open(IMAGE_FILE, "rb") as f:
            r = requests.post(bi.links.self, params={"action": "upload", "size": size},
                              files={"chunk": ("image.raw", f)})
        return r.status_code == 200 or None
    wait_for("upload accepted", upload)
    uploaded = wait_for_backing_image_ready_copies(client, "bi-upload", 1)
    assert uploaded.currentChecksum == IMAGE_SHA512
    assert uploaded.sourceType == "upload"

    client.create_backing_image(name="bi-clone", sourceType="clone",
                                parameters={"backing-image": "bi-upload", "encryption": "ignore"},
                                minNumberOfCopies=1, dataEngine="v1")
    cloned = wait_for_backing_image_ready_copies(client, "bi-clone", 1)
    assert cloned.currentChecksum == IMAGE_SHA512
    assert cloned.expectedChecksum == IMAGE_SHA512  # the mutator copies the source's checksum
    assert cloned.parameters["backing-image"] == "bi-upload"

    wrong = IMAGE_SHA512[1:] + IMAGE_SHA512[0]
    client.create_backing_image(name="bi-wrong", sourceType="download", parameters={"url": IMAGE_URL},
                                expectedChecksum=wrong, dataEngine="v1")
    wait_for("a failed-and-cleanup copy of bi-wrong",
             lambda: "failed-and-cleanup" in states(client.by_id_backing_image("bi-wrong")))
    cleanup_all_backing_images(client)


run(main)
