-- Argo CD health of a GpuQueue, from the conditions the operator writes (crates/api
-- conditions.rs). Degraded: the queue cannot admit as written (InvalidSpec, a namespace that
-- another queue claims too, guarantees above the cluster's capacity). Progressing: the operator
-- has not yet written status for this spec, or a reclaim is handing GPUs over. Healthy: Ready.
local hs = {}

local function condition(conditions, type)
  for _, c in ipairs(conditions) do
    if c.type == type then
      return c
    end
  end
  return nil
end

local function is_true(c)
  return c ~= nil and c.status == "True"
end

if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the gpuqueue operator to report the queue's status"
  return hs
end

local conditions = obj.status.conditions
local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the gpuqueue operator to observe generation " .. generation
  return hs
end

local ready = condition(conditions, "Ready")
local conflict = condition(conditions, "NamespaceConflict")
local overcommitted = condition(conditions, "Overcommitted")
local reclaiming = condition(conditions, "Reclaiming")

if ready ~= nil and ready.status == "False" then
  hs.status = "Degraded"
  hs.message = ready.message
  return hs
end
if is_true(conflict) then
  hs.status = "Degraded"
  hs.message = conflict.message
  return hs
end
if is_true(overcommitted) then
  hs.status = "Degraded"
  hs.message = overcommitted.message
  return hs
end
if is_true(reclaiming) then
  hs.status = "Progressing"
  hs.message = reclaiming.message
  return hs
end
if is_true(ready) then
  hs.status = "Healthy"
  hs.message = ready.message
  return hs
end
hs.status = "Progressing"
hs.message = "Waiting for the Ready condition"
return hs
