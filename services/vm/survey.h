/*
 * survey.h: this node's description and the survey respondent that
 * answers the scheduler with it (survey.c). Not for: the RPC service.
 */
#ifndef MOAT_VMD_SURVEY_H
#define MOAT_VMD_SURVEY_H

#include "moat/rpc.h"
#include "vm.pb-c.h"

struct vmd;

/* vmd_node_fill: NodeInfo / survey answer, heap fields. */
int vmd_node_fill(struct vmd *vmd, Moat__V1__Node *node)
    __attribute__((warn_unused_result));

struct vmd_survey;

/* vmd_survey_start: `list` is one or more gateway survey addresses,
 * separated by commas ([vmd] survey): one nng respondent per address
 * dials it and answers each survey with this node, so every gateway
 * finds every node. *out is the caller's (vmd_survey_stop: all of
 * them). An empty element or an address given twice is refused. */
int vmd_survey_start(struct vmd *vmd, const char *list,
    struct vmd_survey **out, char **errmsg)
    __attribute__((warn_unused_result));
void vmd_survey_stop(struct vmd_survey *s);

/* vmd_survey_split: `list`'s addresses, trimmed, in order (heap; free
 * with vmd_survey_split_free). INVALID_ARGUMENT with *errmsg saying what
 * to fix for an empty element or a duplicate. */
int vmd_survey_split(const char *list, char ***urls, size_t *n, char **errmsg)
    __attribute__((warn_unused_result));
void vmd_survey_split_free(char **urls, size_t n);

struct moat_config;

/* vmd_survey_flags: --survey given more than once on the command line
 * (the config reader keeps the last): sets [vmd] survey to all of them
 * joined by commas. Call after moat_config_from_args. */
int vmd_survey_flags(int argc, char **argv, struct moat_config *cfg)
    __attribute__((warn_unused_result));

#endif
