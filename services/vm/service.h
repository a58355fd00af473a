/*
 * service.h: the Vm RPC service and its method table (service.c). Not
 * for: the handlers' work.
 */
#ifndef MOAT_VMD_SERVICE_H
#define MOAT_VMD_SERVICE_H

#include "moat/rpc.h"

struct vmd;

/* vmd_service: the Vm service with its method table; ctx = vmd. */
void vmd_service(struct vmd *vmd, struct moat_rpc_service *svc);

#endif
