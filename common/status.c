#include "common/status.h"

const char *bt_status_str(bt_status_t st)
{
    switch (st) {
#define BT__STATUS_STR(name, value, str)                                                           \
    case name:                                                                                     \
        return str;
        BT_STATUS_LIST(BT__STATUS_STR)
#undef BT__STATUS_STR
    }
    return "unknown status";
}

const char *bt_status_name(bt_status_t st)
{
    switch (st) {
#define BT__STATUS_NAME(name, value, str)                                                          \
    case name:                                                                                     \
        return #name;
        BT_STATUS_LIST(BT__STATUS_NAME)
#undef BT__STATUS_NAME
    }
    return "BT_UNKNOWN";
}
