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

/* vmd_survey_start: dials `url` as an nng respondent and answers each
 * survey with this node. *out is the caller's (vmd_survey_stop). */
int vmd_survey_start(struct vmd *vmd, const char *url, struct vmd_survey **out,
    char **errmsg) __attribute__((warn_unused_result));
void vmd_survey_stop(struct vmd_survey *s);

#endif
