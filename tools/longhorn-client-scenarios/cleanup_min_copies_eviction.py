"""test_backing_image_min_number_of_replicas (updateMinNumberOfCopies), backingImageCleanup with the HA rule,
update_setting, and test_backing_image_disk_eviction (node.diskUpdate with evictionRequested)."""
from common import (IMAGE_SHA512, IMAGE_URL, cleanup_all_backing_images, create_backing_image_with_matching_url,
                    disk_map, expect_api_error, longhorn, run, update_setting, wait_for,
                    wait_for_backing_image_disk_cleanup, wait_for_backing_image_ready_copies)


def disk_update_input(disks, evict_uuid=None):
    """common.get_update_disks: the disks as diskUpdate takes them, optionally evicting one."""
    out = {}
    for name, d in disks.__dict__.items():
        evict = d.diskUUID == evict_uuid
        out[name] = {"path": d.path, "allowScheduling": False if evict else d.allowScheduling,
                     "evictionRequested": True if evict else d.evictionRequested,
                     "storageReserved": d.storageReserved, "tags": list(d.tags or [])}
    return out


def main(client):
    bi = create_backing_image_with_matching_url(client, "bi-test", IMAGE_URL, IMAGE_SHA512)
    bi = bi.updateMinNumberOfCopies(minNumberOfCopies=2)
    assert bi.minNumberOfCopies == 2
    bi = wait_for_backing_image_ready_copies(client, "bi-test", 2)

    expect_api_error(lambda: bi.updateMinNumberOfCopies(minNumberOfCopies=0),
                     "minimum number of backing image copies 0 must larger than 0")
    disks = list(disk_map(bi).keys())
    e = expect_api_error(lambda: bi.backingImageCleanup(disks=[disks[0]]),
                         "failed to do cleanup since there will be no enough ready files for HA after the deletion")
    assert e.error.code == 500
    assert len(disk_map(client.by_id_backing_image("bi-test"))) == 2

    setting = update_setting(client, "backing-image-cleanup-wait-interval", "1")
    assert setting.value == "1"
    assert client.by_id_setting("backing-image-cleanup-wait-interval").value == "1"

    bi = bi.updateMinNumberOfCopies(minNumberOfCopies=1)
    assert bi.minNumberOfCopies == 1
    bi = bi.backingImageCleanup(disks=[disks[0]])
    assert bi.type == "backingImage"
    wait_for_backing_image_disk_cleanup(client, "bi-test", disks[0])
    bi = wait_for_backing_image_ready_copies(client, "bi-test", 1)

    # Disk eviction: the only copy moves off its disk.
    copy_disk = list(disk_map(bi).keys())[0]
    node = client.list_node()[0]
    node = client.by_id_node(node.id)
    node = node.diskUpdate(disks=disk_update_input(node.disks, evict_uuid=copy_disk))
    evicted = [d for d in node.disks.__dict__.values() if d.diskUUID == copy_disk][0]
    assert evicted.evictionRequested is True and evicted.allowScheduling is False

    def moved():
        b = client.by_id_backing_image("bi-test")
        m = disk_map(b)
        return b if copy_disk not in m and [s.state for s in m.values()] == ["ready"] else None
    wait_for("the copy moved off the evicted disk", moved)

    node = client.by_id_node(node.id)
    restored = {}
    for name, d in disk_update_input(node.disks).items():
        d["allowScheduling"], d["evictionRequested"] = True, False
        restored[name] = d
    node.diskUpdate(disks=restored)
    update_setting(client, "backing-image-cleanup-wait-interval", "60")
    cleanup_all_backing_images(client)


run(main)
