/* kvstash public API: a distributed object store for LLM KV cache. Everything not declared
 * under include/kvstash/ is internal. */
#ifndef KVSTASH_KVSTASH_H
#define KVSTASH_KVSTASH_H

#include <kvstash/client.h>
#include <kvstash/status.h>
#include <kvstash/version.h>

#endif
