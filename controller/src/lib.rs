//! swimlb controller: assigns LoadBalancer Service IPs from address pools.
