#!/bin/sh
# /etc/swimlb/notify.sh: called by the speaker as `notify.sh GROUP STATE` on every change of a
# group's state (STATE is owner, backup or fault). Here it only tells the journal.
logger -t swimlb-notify "group $1 is now $2 on $(hostname)"
