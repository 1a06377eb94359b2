{
  "targets": [
    {
      "target_name": "block_mapping",
      "sources": ["src/block_mapping.c"],
      "cflags": ["-O2", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"],
      "defines": ["NAPI_VERSION=8", "_GNU_SOURCE", "_FILE_OFFSET_BITS=64"]
    }
  ]
}
