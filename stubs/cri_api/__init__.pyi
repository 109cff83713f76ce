# The CRI package (container-runtime-interface-api): only its v1 API modules are stubbed.
