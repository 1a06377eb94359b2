"""Backup backing images: bi.backupBackingImageCreate, list/by_id (both spellings), restore through
bbi.backupBackingImageRestore, refusals with Longhorn's messages, client.delete(bbi)."""
from common import (IMAGE_SHA512, IMAGE_URL, cleanup_all_backing_images, create_backing_image_with_matching_url,
                    expect_api_error, run, wait_for, wait_for_backing_image_delete,
                    wait_for_backing_image_ready_copies)


def main(client):
    bi = create_backing_image_with_matching_url(client, "bi-backup", IMAGE_URL, IMAGE_SHA512)
    bi.backupBackingImageCreate(backupTargetName="default")

    def completed():
        items = [b for b in client.list_backupBackingImage() if b.backingImageName == "bi-backup"]
        return items[0] if items and items[0].state == "Completed" else None
    bbi = wait_for("backup completed", completed)
    assert bbi.backupTargetName == "default"
    assert bbi.url != ""
    assert bbi.size > 0
    assert client.by_id_backupBackingImage(bbi.name).name == bbi.name
    assert [b.name for b in client.list_backup_backing_image()] == [bbi.name]

    expect_api_error(lambda: bi.backupBackingImageCreate(backupTargetName="default"),
                     "backup backing image bi-backup for backup target default already exists")
    expect_api_error(lambda: bbi.backupBackingImageRestore(secret="", secretNamespace="", dataEngine="v1"),
                     "backing image bi-backup already exists")

    client.delete(bi)
    wait_for_backing_image_delete(client, "bi-backup")
    bbi = client.by_id_backupBackingImage(bbi.name)
    bbi.backupBackingImageRestore(secret="", secretNamespace="", dataEngine="v1")
    restored = wait_for_backing_image_ready_copies(client, "bi-backup", 1)
    assert restored.sourceType == "restore"
    assert restored.currentChecksum == IMAGE_SHA512

    client.delete(bbi)
    wait_for("backup deleted", lambda: len(client.list_backupBackingImage()) == 0)
    assert client.by_id_backupBackingImage(bbi.name) is None
    cleanup_all_backing_images(client)


run(main)
