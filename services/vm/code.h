/*
 * code.h: persistent code contexts (code.c): RunCode and
 * CloseCodeContext. Not for: plain execs (exec.h).
 */
#ifndef MOAT_VMD_CODE_H
#define MOAT_VMD_CODE_H

#include "moat/rpc.h"
#include "vm.pb-c.h"

struct vmd;

/* vmd_code_run: RunCode; one CodeRun to the agent, answered with the
 * cell's CodeResult (reply->result, heap, the server frees it). */
int vmd_code_run(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__RunCodeRequest *req, Moat__V1__RunCodeResult *reply)
    __attribute__((warn_unused_result));
/* vmd_code_close: CloseCodeContext; NOT_FOUND when no such context. */
int vmd_code_close(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__CodeContextCall *req) __attribute__((warn_unused_result));

#endif
