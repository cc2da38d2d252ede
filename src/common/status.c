/* Status strings, generated from the single table in kvstash/status.h. */
#include <kvstash/status.h>

const char *kvs_status_str(int status)
{
    switch (status) {
#define KVS_STATUS_STR_(name, num, msg)                                                            \
    case (num):                                                                                    \
        return (msg);
        KVS_STATUS_TABLE(KVS_STATUS_STR_)
#undef KVS_STATUS_STR_
    default:
        return "unknown status";
    }
}

const char *kvs_status_name(int status)
{
    switch (status) {
#define KVS_STATUS_NAME_(name, num, msg)                                                           \
    case (num):                                                                                    \
        return #name;
        KVS_STATUS_TABLE(KVS_STATUS_NAME_)
#undef KVS_STATUS_NAME_
    default:
        return "UNKNOWN";
    }
}
