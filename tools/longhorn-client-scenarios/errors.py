"""Refused creations carry Longhorn's messages (webhook/resources/backingimage/validator.go), wrapped as
api/backingimage.go does; missing objects are None / 404."""
from common import IMAGE_SHA512, IMAGE_URL, expect_api_error, run, wait_for_backing_image_delete


def create(client, name, source_type, parameters, **kw):
    return lambda: client.create_backing_image(name=name, sourceType=source_type, parameters=parameters, **kw)


def main(client):
    wrap = "failed to create backing image bad from source type download with parameters "
    cases = [
        ({}, "map[]: ", "download URL is not provided"),
        ({"url": "x"}, "map[url:x]: ", 'invalid download URL: parse "x": invalid URI for request'),
        ({"url": "ftp://h/x.img"}, "map[url:ftp://h/x.img]: ", 'invalid download URL scheme "ftp"'),
        ({"url": "http://localhost:9/x.img"}, "", "download URL must not target a loopback address"),
        ({"url": "http:///x.img"}, "", "download URL must not target a loopback address"),
        ({"url": "http://10.0.0.5/x.img"}, "", "download URL is not an allowed source host"),
        ({"url": "http://169.254.169.254/latest"}, "", "download URL is not an allowed source host"),
    ]
    for params, wrapped_params, message in cases:
        e = expect_api_error(create(client, "bad", "download", params), wrap + wrapped_params,
                             'admission webhook "validator.longhorn.io" denied the request: ', message)
        assert e.error.code == 500, e.error.code
    expect_api_error(create(client, "bad", "download", {"url": IMAGE_URL}, expectedChecksum="abc"),
                     "invalid checksum abc")
    expect_api_error(create(client, "bad", "download", {"url": IMAGE_URL}, minNumberOfCopies=-1),
                     "minimum number of backing image copies -1 must larger than 0")
    assert len(client.list_backing_image()) == 0
    assert client.by_id_backing_image("bad") is None
    assert client.by_id_backupBackingImage("bad") is None

    client.create_backing_image(name="twice", sourceType="download", parameters={"url": IMAGE_URL},
                                expectedChecksum=IMAGE_SHA512)
    expect_api_error(create(client, "twice", "download", {"url": IMAGE_URL}),
                     'backingimages.longhorn.io "twice" already exists')
    expect_api_error(create(client, "bad", "clone", {"backing-image": "twice", "encryption": "encrypt"}),
                     "failed to create backing image bad from source type clone with parameters "
                     "map[backing-image:twice encryption:encrypt]: ",
                     "secret is not provided for encryption or decryption during cloneing")
    client.delete(client.by_id_backing_image("twice"))
    wait_for_backing_image_delete(client, "twice")


run(main)
