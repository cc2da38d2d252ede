/* Status codes shared by every kvstash API. Numbers match Mooncake's ErrorCode where the
 * meaning is the same, so code written against Mooncake's integers keeps working. */
#ifndef KVSTASH_STATUS_H
#define KVSTASH_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, number, message). The one table that generates the enum and kvs_status_str(). */
#define KVS_STATUS_TABLE(X)                                                                        \
    X(OK, 0, "success")                                                                            \
    X(INTERNAL_ERROR, -1, "internal error")                                                        \
    X(BUFFER_OVERFLOW, -10, "buffer too small")                                                    \
    X(SEGMENT_NOT_FOUND, -101, "segment not found")                                                \
    X(SEGMENT_ALREADY_EXISTS, -102, "segment already exists")                                      \
    X(CLIENT_NOT_FOUND, -103, "client not known to the master")                                    \
    X(NO_AVAILABLE_HANDLE, -200, "no space left in the store")                                     \
    X(INVALID_VERSION, -300, "protocol version mismatch")                                          \
    X(INVALID_KEY, -400, "invalid key")                                                            \
    X(INVALID_PARAMS, -600, "invalid parameters")                                                  \
    X(INVALID_WRITE, -700, "invalid write")                                                        \
    X(INVALID_READ, -701, "invalid read")                                                          \
    X(INVALID_REPLICA, -702, "invalid replica")                                                    \
    X(REPLICA_IS_NOT_READY, -703, "object is not complete yet")                                    \
    X(OBJECT_NOT_FOUND, -704, "object not found")                                                  \
    X(OBJECT_ALREADY_EXISTS, -705, "object already exists")                                        \
    X(OBJECT_HAS_LEASE, -706, "object has a read lease")                                           \
    X(LEASE_EXPIRED, -707, "read lease expired before the transfer completed")                     \
    X(TRANSFER_FAIL, -800, "transfer failed")                                                      \
    X(RPC_FAIL, -900, "rpc failed")                                                                \
    X(TIMED_OUT, -901, "timed out")                                                                \
    X(NO_MEMORY, -1500, "out of memory")                                                           \
    X(PROTOCOL_ERROR, -1501, "malformed message")                                                  \
    X(IO_ERROR, -1502, "i/o error")                                                                \
    X(UNSUPPORTED, -1503, "not supported")                                                         \
    X(AUTH_FAILED, -1504, "authentication failed")                                                 \
    X(NO_RESOURCE, -1505, "a server resource limit was reached")                                   \
    X(NOT_LEADER, -1506, "this master is not the leader")                                          \
    X(NO_LEADER, -1507, "no master leads the cluster (etcd has no leader)")

/* TIMED_OUT uses Mooncake's RPC_TIMEOUT number; NO_MEMORY and the codes after it are
 * kvstash's own (Mooncake has no equivalent). */
typedef enum {
#define KVS_STATUS_ENUM_(name, num, msg) KVS_##name = (num),
    KVS_STATUS_TABLE(KVS_STATUS_ENUM_)
#undef KVS_STATUS_ENUM_
} kvs_status_t;

/* Returns a static, human-readable description of a status (never NULL; unknown codes give
 * "unknown status"). */
const char *kvs_status_str(int status);

/* Returns the symbolic name ("OBJECT_NOT_FOUND") of a status, or "UNKNOWN". Static string. */
const char *kvs_status_name(int status);

/* The calling thread's one-line explanation of the last failed kvstash call ("" if none yet).
 * Thread-local; valid until that thread's next failing call. */
const char *kvs_last_error(void);

#ifdef __cplusplus
}
#endif
#endif
