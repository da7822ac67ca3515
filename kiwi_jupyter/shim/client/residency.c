/* Where the process's memory is, as the daemon hears it (the hello feature `memory`,
 * docs/protocol.md): the bytes on its GPU now (`resident`), in host memory now (`host`) and
 * kept in host memory for evictions (`shadow`: the vmm evictor's shadows, made ahead), in
 * `register` and in `working_set`; and `evicted`, which ends every eviction, asked by the
 * daemon (its `evict` event) or done for a drop, or says a move failed (a restore rolled back).
 *
 * All of it only when the daemon's `welcome` listed `memory`: a daemon that did not hears the
 * working set as before, and no `evicted`. Reports are at most one every REPORT_INTERVAL, but
 * one still held back goes before a release; during an eviction one more for each
 * KIWI_PROGRESS_BYTES the card gets back, so the daemon may let the next holder's restore
 * begin while the rest of the way out goes on.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "client.h"

#define REPORT_INTERVAL 0.05

static void send_working_set(struct kiwi_client *c, const struct kiwi_residency *where)
{
    struct kiwi_working_set ws;
    kiwi_memory_working_set(&ws);
    char fields[512];
    snprintf(fields, sizeof fields,
             "\"" KIWI_FIELD_BYTES "\":%llu,\"" KIWI_FIELD_EVICTABLE "\":%llu",
             (unsigned long long)ws.bytes, (unsigned long long)ws.evictable);
    if (where)
        kiwi_json_residency(fields, sizeof fields, where);
    if (where && kiwi_session_tiers(c))
        kiwi_json_tiers(fields, sizeof fields, where);
    kiwi_session_request(c, KIWI_OP_WORKING_SET, fields);
    c->last_report = kiwi_now();
}

double kiwi_residency_report(struct kiwi_client *c)
{
    if (!kiwi_session_memory(c)) {
        send_working_set(c, NULL); /* today's report, as soon as the news comes */
        return 0;
    }
    double wait = c->last_report + REPORT_INTERVAL - kiwi_now();
    if (wait > 0) {
        kiwi_news_set(KIWI_NEWS_WORKING_SET); /* still to say, once the interval is over */
        return wait;
    }
    struct kiwi_residency where;
    kiwi_pager_residency(&where);
    send_working_set(c, &where);
    return 0;
}

/* The daemon makes the next holder's room from what a release leaves on the card, so the
 * figures it has when the hold ends must be the current ones: the report after a restore, or
 * after allocations in the hold, may still be held back by the rate limit, and would reach the
 * daemon after the release, which then counted the memory as still in host memory (or the
 * working set as it was) and handed the GPU over without the room. */
void kiwi_residency_before_release(struct kiwi_client *c)
{
    if (!kiwi_news_take(KIWI_NEWS_WORKING_SET))
        return;
    if (!kiwi_session_memory(c)) {
        send_working_set(c, NULL);
        return;
    }
    struct kiwi_residency where;
    kiwi_pager_residency(&where);
    send_working_set(c, &where);
}

void kiwi_residency_progress(const struct kiwi_residency *now, void *client)
{
    send_working_set(client, now);
}

void kiwi_residency_evicted(struct kiwi_client *c, const struct kiwi_transfer *moved,
                            const char *failed)
{
    if (!kiwi_session_memory(c))
        return;
    struct kiwi_residency where;
    kiwi_pager_residency(&where);
    char fields[640] = "";
    kiwi_json_residency(fields, sizeof fields, &where);
    if (kiwi_session_tiers(c))
        kiwi_json_tiers(fields, sizeof fields, &where);
    size_t n = strlen(fields);
    if (failed) {
        snprintf(fields + n, sizeof fields - n, ",\"" KIWI_FIELD_FAILED "\":");
        kiwi_json_quote(fields, sizeof fields, failed);
    } else {
        snprintf(fields + n, sizeof fields - n,
                 ",\"" KIWI_FIELD_MOVED "\":%llu,\"" KIWI_FIELD_SECONDS "\":%.6f",
                 (unsigned long long)(moved ? moved->bytes : 0), moved ? moved->seconds : 0.0);
    }
    kiwi_session_request(c, KIWI_OP_EVICTED, fields);
    c->last_report = kiwi_now();
}

