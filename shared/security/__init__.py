"""Who may call what: caller identities, keys, the gRPC auth interceptor, TLS, development credentials.

One mechanism for every service (see SECURITY.md at the repository root):
- `keys.KeyRing` holds the accepted credentials (backend, operator and service keys, client-certificate
  names), read from `APPRENTICE_AUTH_KEYS` and/or the mounted file `APPRENTICE_AUTH_KEYS_FILE`, reloaded
  when the file changes (rotation without a restart);
- `interceptor.AuthInterceptor` authenticates each call and enforces `policy.METHOD_ROLES`; handlers read
  the caller with `identity.current_identity()`;
- `tls` builds server and channel credentials (TLS, mutual TLS) and `channels.open_channel` is the one way
  a process dials another service, presenting its own credential;
- `binding.resolve_bind_host` refuses to expose an unauthenticated server beyond loopback.
"""
