/* SPDX-License-Identifier: MIT */
/* reload.c: SIGHUP re-reads the configuration. */

#include <errno.h>

#include "daemon/log.h"
#include "daemon/manager.h"

int manager_reload(Manager *m) {
        log_notice("SIGHUP received; live reconfiguration is not implemented yet, ignoring");
        return 0;
}
