"""Create from a download URL through create_backing_image_with_matching_url, then the fields the longhorn-tests
helpers read, list, get (None for a missing one), delete and wait_for_backing_image_delete."""
from common import (IMAGE_SHA512, IMAGE_URL, create_backing_image_with_matching_url, disk_map, run, states,
                    wait_for_backing_image_delete)


def main(client):
    assert client.by_id_schema("backingImage").id == "backingImage"  # backing_image_feature_supported
    bi = create_backing_image_with_matching_url(client, "bi-test", IMAGE_URL, IMAGE_SHA512)
    assert bi.sourceType == "download"
    assert bi.parameters["url"] == IMAGE_URL
    assert bi.currentChecksum == IMAGE_SHA512
    assert bi.expectedChecksum == IMAGE_SHA512
    assert not bi.deletionTimestamp
    assert bi.minNumberOfCopies == 1
    assert states(bi) == ["ready"], states(bi)
    assert len(disk_map(bi)) == 1
    names = [b.name for b in client.list_backing_image()]
    assert names == ["bi-test"], names
    assert [b.name for b in client.list_backingImage()] == ["bi-test"]
    assert client.by_id_backing_image("bi-test").uuid == bi.uuid
    assert client.by_id_backing_image("no-such-image") is None
    client.delete(bi)
    wait_for_backing_image_delete(client, "bi-test")
    assert client.by_id_backing_image("bi-test") is None


run(main)
