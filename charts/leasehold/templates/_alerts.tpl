{{- /*
The alert rules, as the `groups` of a Prometheus rules file. The PrometheusRule renders them; the tests
(operator/tests/alerts.rs) render the same groups and run `promtool test rules` on them. Every expression
groups by the labels the PodMonitor gives worker series: namespace, consumer (the StreamConsumer), pod.
The operator's series (group leasehold.operator) carry the StreamConsumer's namespace and name; their
alerts present the name as `consumer` like the rest. Each alert links its runbook: docs/operations.md,
"Alerts and runbooks".
*/ -}}
{{- define "leasehold.alertGroups" -}}
{{- $a := .Values.monitoring.prometheusRule.alerts -}}
{{- $base := .Values.monitoring.prometheusRule.runbookBaseUrl -}}
{{- $extra := .Values.monitoring.prometheusRule.additionalLabels -}}
- name: leasehold.workers
  rules:
    {{- with $a.shardBehindLatest }}{{ if .enabled }}
    - alert: LeaseholdShardBehindLatest
      expr: max by (namespace, consumer, shard) (leasehold_millis_behind_latest) / 1000 > {{ .seconds }}
      for: {{ .for }}
      labels:
        severity: {{ .severity }}
        {{- with $extra }}{{ toYaml . | nindent 8 }}{{ end }}
      annotations:
        summary: "Shard {{`{{ $labels.shard }}`}} of {{`{{ $labels.namespace }}/{{ $labels.consumer }}`}} is {{`{{ $value | humanizeDuration }}`}} behind the stream's tip"
        description: "The worker reading this shard reports a millisBehindLatest above {{ .seconds }} s for {{ .for }}: records wait longer than that before they are processed."
        runbook_url: {{ printf "%s#leaseholdshardbehindlatest" $base }}
    {{- end }}{{ end }}
    {{- with $a.noLeasesHeld }}{{ if .enabled }}
    - alert: LeaseholdNoLeasesHeld
      expr: sum by (namespace, consumer) (leasehold_leases_held) == 0
      for: {{ .for }}
      labels:
        severity: {{ .severity }}
        {{- with $extra }}{{ toYaml . | nindent 8 }}{{ end }}
      annotations:
        summary: "No worker of {{`{{ $labels.namespace }}/{{ $labels.consumer }}`}} holds a lease: no shard is read"
        description: "Workers are up and scraped, but together they have held no lease for {{ .for }}."
        runbook_url: {{ printf "%s#leaseholdnoleasesheld" $base }}
    {{- end }}{{ end }}
    {{- with $a.leaseTakeovers }}{{ if .enabled }}
    - alert: LeaseholdLeaseTakeovers
      expr: sum by (namespace, consumer) (rate(leasehold_lease_takeovers_total[{{ .window }}])) * 60 > {{ .perMinute }}
      for: {{ .for }}
      labels:
        severity: {{ .severity }}
        {{- with $extra }}{{ toYaml . | nindent 8 }}{{ end }}
      annotations:
        summary: "Leases of {{`{{ $labels.namespace }}/{{ $labels.consumer }}`}} are taken over {{`{{ $value | printf \"%.1f\" }}`}} times a minute"
        description: "Workers take leases over from holders that stopped renewing them (takeovers, not cooperative handoffs): holders crash, stall or lose the lease table. Shards move without a final checkpoint, so records are processed twice."
        runbook_url: {{ printf "%s#leaseholdleasetakeovers" $base }}
    {{- end }}{{ end }}
    {{- with $a.processorFailures }}{{ if .enabled }}
    - alert: LeaseholdProcessorFailures
      expr: sum by (namespace, consumer) (rate(leasehold_records_failed_total[{{ .window }}])) > {{ .perSecond }}
      for: {{ .for }}
      labels:
        severity: {{ .severity }}
        {{- with $extra }}{{ toYaml . | nindent 8 }}{{ end }}
      annotations:
        summary: "The processor of {{`{{ $labels.namespace }}/{{ $labels.consumer }}`}} fails {{`{{ $value | printf \"%.2f\" }}`}} attempts a second"
        description: "Failed processing attempts above {{ .perSecond }}/s for {{ .for }}; the retry policy decides what happens to records whose attempts run out."
        runbook_url: {{ printf "%s#leaseholdprocessorfailures" $base }}
    {{- end }}{{ end }}
    {{- with $a.recordsDropped }}{{ if .enabled }}
    - alert: LeaseholdRecordsDropped
      expr: sum by (namespace, consumer, policy) (increase(leasehold_records_exhausted_total{policy=~"skip|deadLetter"}[{{ .window }}])) > {{ .count }}
      for: {{ .for }}
      labels:
        severity: {{ .severity }}
        {{- with $extra }}{{ toYaml . | nindent 8 }}{{ end }}
      annotations:
        summary: "{{`{{ $value | printf \"%.0f\" }}`}} records of {{`{{ $labels.namespace }}/{{ $labels.consumer }}`}} ran out of attempts and were handled by policy {{`{{ $labels.policy }}`}}"
        description: "Records were skipped or sent to the dead-letter stream within {{ .window }}: they were not processed."
        runbook_url: {{ printf "%s#leaseholdrecordsdropped" $base }}
    {{- end }}{{ end }}
    {{- with $a.recordsStuck }}{{ if .enabled }}
    - alert: LeaseholdRecordsStuck
      expr: max by (namespace, consumer, pod) (leasehold_records_stuck) > 0
      for: {{ .for }}
      labels:
        severity: {{ .severity }}
        {{- with $extra }}{{ toYaml . | nindent 8 }}{{ end }}
      annotations:
        summary: "{{`{{ $value }}`}} records are stuck in the processor of {{`{{ $labels.pod }}`}} ({{`{{ $labels.namespace }}/{{ $labels.consumer }}`}})"
        description: "A processing call has run longer than lease.gracefulTimeout without returning, for {{ .for }}; its shard makes no progress."
        runbook_url: {{ printf "%s#leaseholdrecordsstuck" $base }}
    {{- end }}{{ end }}
    {{- with $a.leaseTableErrors }}{{ if .enabled }}
    - alert: LeaseholdLeaseTableErrors
      expr: sum by (namespace, consumer) (rate(leasehold_lease_table_failures_total[{{ .window }}])) > {{ .perSecond }} or max by (namespace, consumer) (leasehold_lease_table_missing) > 0
      for: {{ .for }}
      labels:
        severity: {{ .severity }}
        {{- with $extra }}{{ toYaml . | nindent 8 }}{{ end }}
      annotations:
        summary: "The lease table of {{`{{ $labels.namespace }}/{{ $labels.consumer }}`}} fails, is throttled or is missing"
        description: "Scans and heartbeats fail above {{ .perSecond }}/s (errors and throttling), or the table does not exist; leases cannot be renewed or balanced."
        runbook_url: {{ printf "%s#leaseholdleasetableerrors" $base }}
    {{- end }}{{ end }}
    {{- with $a.fanOutFailing }}{{ if .enabled }}
    - alert: LeaseholdFanOutFailing
      expr: sum by (namespace, consumer) (rate(leasehold_fanout_subscribe_failures_total[{{ .window }}])) > {{ .perSecond }} or sum by (namespace, consumer) (increase(leasehold_fanout_shards_given_up_total[{{ .window }}])) > 0
      for: {{ .for }}
      labels:
        severity: {{ .severity }}
        {{- with $extra }}{{ toYaml . | nindent 8 }}{{ end }}
      annotations:
        summary: "Enhanced fan-out subscriptions of {{`{{ $labels.namespace }}/{{ $labels.consumer }}`}} are failing"
        description: "SubscribeToShard is refused or fails above {{ .perSecond }}/s, or workers gave shards up because no subscription delivered within a lease duration."
        runbook_url: {{ printf "%s#leaseholdfanoutfailing" $base }}
    {{- end }}{{ end }}
    {{- with $a.workerRestarting }}{{ if .enabled }}
    - alert: LeaseholdWorkerRestarting
      expr: max by (namespace, consumer, pod) (resets(leasehold_checkpoints_written_total[{{ .window }}])) > {{ .restarts }}
      for: {{ .for }}
      labels:
        severity: {{ .severity }}
        {{- with $extra }}{{ toYaml . | nindent 8 }}{{ end }}
      annotations:
        summary: "Worker {{`{{ $labels.pod }}`}} of {{`{{ $labels.namespace }}/{{ $labels.consumer }}`}} restarted {{`{{ $value }}`}} times in {{ .window }}"
        description: "The worker's counters started over more than {{ .restarts }} times within {{ .window }}: its process keeps restarting (crash, OOM kill, failed liveness probe)."
        runbook_url: {{ printf "%s#leaseholdworkerrestarting" $base }}
    {{- end }}{{ end }}
- name: leasehold.operator
  rules:
    {{- with $a.consumerLag }}{{ if .enabled }}
    - alert: LeaseholdConsumerLagHigh
      expr: max by (namespace, consumer) (label_replace(leasehold_consumer_lag_seconds, "consumer", "$1", "name", "(.*)")) > {{ .seconds }}
      for: {{ .for }}
      labels:
        severity: {{ .severity }}
        {{- with $extra }}{{ toYaml . | nindent 8 }}{{ end }}
      annotations:
        summary: "{{`{{ $labels.namespace }}/{{ $labels.consumer }}`}} is {{`{{ $value | humanizeDuration }}`}} behind on its slowest shard"
        description: "The largest lag the workers write into the lease rows (the age of the oldest record read and not finished) has stayed above {{ .seconds }} s for {{ .for }}."
        runbook_url: {{ printf "%s#leaseholdconsumerlaghigh" $base }}
    {{- end }}{{ end }}
    {{- with $a.shardsUnheld }}{{ if .enabled }}
    - alert: LeaseholdShardsUnheld
      expr: max by (namespace, consumer) (label_replace(leasehold_consumer_unheld_shards, "consumer", "$1", "name", "(.*)")) > 0
      for: {{ .for }}
      labels:
        severity: {{ .severity }}
        {{- with $extra }}{{ toYaml . | nindent 8 }}{{ end }}
      annotations:
        summary: "{{`{{ $value }}`}} open shards of {{`{{ $labels.namespace }}/{{ $labels.consumer }}`}} have no live holder: nobody reads them"
        description: "The operator reads lease rows of open shards with no owner, or whose lease ran out more than a lease duration ago, for {{ .for }}: those shards are not read and their lag grows."
        runbook_url: {{ printf "%s#leaseholdshardsunheld" $base }}
    {{- end }}{{ end }}
{{- end -}}
