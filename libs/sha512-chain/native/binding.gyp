{
  "targets": [
    {
      "target_name": "sha512_chain",
      "sources": ["src/sha512_chain.c"],
      "cflags": ["-O2", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"],
      "defines": ["NAPI_VERSION=8", "OPENSSL_SUPPRESS_DEPRECATED"]
    }
  ]
}
